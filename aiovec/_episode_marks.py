"""What a batch of results says about episodes, read alike by every learning-side class
(:class:`~aiovec.EpisodeStatistics`, :class:`~aiovec.TransitionAssembler`,
:class:`~aiovec.ReplayBuffer`): which rows a restart answered, and whether the batch can
come from a vector env autoresetting in the mode the reader was built for.

Why the mode is checked: each mode places an episode's boundary differently (``NEXT_STEP``:
the result after an end is the reset; ``SAME_STEP``: the end's result already holds the
reset, its last observation in ``infos["final_obs"]``). Read in the wrong mode, a batch
silently loses or invents a step at every episode end.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np
from gymnasium.vector import AutoresetMode


def autoreset_mode_of(env: Any) -> AutoresetMode | None:
    """The autoreset mode of ``env`` (an ``aiovec.VecEnv``, or any Gymnasium vector env
    or vector wrapper, through its metadata); ``None`` if it does not say."""
    mode = getattr(env, "autoreset_mode", None) or env.metadata.get("autoreset_mode")
    return None if mode is None else AutoresetMode(mode)


def info_mask(infos: Any, key: str, count: int) -> np.ndarray:
    """Rows whose info has ``key`` set to True (Gymnasium's vector format: ``_key``)."""
    if not isinstance(infos, dict) or key not in infos:
        return np.zeros(count, dtype=np.bool_)
    values = np.asarray(infos[key])
    mask = np.asarray(infos.get(f"_{key}", np.ones(count, dtype=np.bool_)), dtype=np.bool_)
    # elementwise (values may be objects): an array, though typed Any
    return cast(np.ndarray, mask & (values == True))  # noqa: E712


def check_autoreset_mode(
    mode: AutoresetMode,
    infos: Any,
    ended: np.ndarray,
    restarted: np.ndarray,
    after_end: np.ndarray,
    reader: str,
) -> None:
    """Raise unless a batch with these ``infos`` and end flags (``ended``: terminated or
    truncated, per row; ``restarted``: rows a rebuilt env answered; ``after_end``: rows
    of envs whose episode ended, with no reset recorded since) can come from a vector
    env autoresetting in ``mode``.

    Raises:
        ValueError: the batch carries ``final_obs`` and ``mode`` is not ``SAME_STEP``;
            ``mode`` is ``SAME_STEP`` and an episode ended without it; or ``mode`` is
            ``DISABLED`` and an env answered after its episode ended without a reset.
            Names both modes and the fix (``reader.for_env(envs)``).
    """
    if isinstance(infos, dict) and "_final_obs" in infos:
        has_final = np.asarray(infos["_final_obs"], dtype=np.bool_)
    else:
        has_final = np.zeros(len(ended), dtype=np.bool_)
    if mode is not AutoresetMode.SAME_STEP and has_final.any():
        found = AutoresetMode.SAME_STEP
    elif mode is AutoresetMode.SAME_STEP and (ended & ~restarted & ~has_final).any():
        found = AutoresetMode.NEXT_STEP  # or DISABLED: neither gives final_obs
    elif mode is AutoresetMode.DISABLED and (after_end & ~restarted).any():
        # a DISABLED env steps again only after a reset, which the reader records
        raise ValueError(
            f"this {reader} was built for autoreset_mode=DISABLED, but an env answered "
            "after its episode ended with no reset recorded: the vector env autoresets "
            f"(NEXT_STEP or SAME_STEP): build it with {reader}.for_env(envs); with DISABLED, "
            f"give {reader}.reset(...) the envs you reset"
        )
    else:
        return
    raise ValueError(
        f"this {reader} was built for autoreset_mode={mode.name}, but the batch comes from a "
        f"vector env autoresetting in another mode ({found.name}"
        f"{' or DISABLED' if found is AutoresetMode.NEXT_STEP else ''}: "
        f"{'infos carry' if found is AutoresetMode.SAME_STEP else 'an episode ended without'} "
        f"'final_obs'); build it with {reader}.for_env(envs) or the env's autoreset_mode"
    )
