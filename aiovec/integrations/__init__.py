"""Adapters that let aiovec envs drive the RL libraries people already use."""
