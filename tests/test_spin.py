"""The spin policy keeps whichever way of waiting (spin first, or sleep at once) has
been faster, and keeps measuring the other."""

from __future__ import annotations

import time

from aiovec._transport.spin import EXPLORE_EVERY, SpinPolicy


def _wait(policy: SpinPolicy, spun_cost: float, slept_cost: float) -> bool:
    """One simulated wait; returns whether it spun."""
    spin = policy.begin()
    time.sleep(spun_cost if spin else slept_cost)
    policy.end()
    return bool(spin)


def test_spinning_stops_when_it_costs_more_than_sleeping():
    policy = SpinPolicy(200e-6)
    ways = [_wait(policy, spun_cost=0.004, slept_cost=0.0005) for _ in range(5 * EXPLORE_EVERY)]
    settled = ways[2 * EXPLORE_EVERY :]
    # Only the exploring waits still spin once sleeping has proved faster.
    assert sum(settled) <= len(settled) // EXPLORE_EVERY + 1


def test_spinning_stays_on_while_it_pays():
    policy = SpinPolicy(200e-6)
    ways = [_wait(policy, spun_cost=0.0005, slept_cost=0.004) for _ in range(5 * EXPLORE_EVERY)]
    settled = ways[2 * EXPLORE_EVERY :]
    assert len(settled) - sum(settled) <= len(settled) // EXPLORE_EVERY + 1


def test_a_zero_window_never_spins():
    policy = SpinPolicy(0.0)
    assert all(policy.begin() == 0.0 for _ in range(50))
