"""Argument checks of the vector env's public calls: pure functions that raise an
error naming the problem and the fix before any state changes. They read nothing but
their arguments, and change nothing."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, MutableMapping
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode

from aiovec._worker.blocks import same_value
from aiovec._worker.host import EnvDescription
from aiovec.errors import InvalidSeedError


def refuse_custom_worker(worker: Callable[..., None]) -> None:
    """Refuse ``AsyncVectorEnv``'s ``worker=``: aiovec's workers do not run Gymnasium's
    pipe protocol. A function without Gymnasium's 8 parameters gets Gymnasium's own
    complaint first, so code that checks for it still sees it."""
    try:
        signature = inspect.signature(worker)
    except (TypeError, ValueError):
        signature = None
    fix = (
        "aiovec's workers do not run Gymnasium's pipe protocol, so custom worker functions "
        "cannot run in them: leave `worker` out (per-env behaviour belongs in the env or "
        "a wrapper), or use gymnasium.vector.AsyncVectorEnv for this env"
    )
    if signature is not None:
        try:
            signature.bind(*(None,) * 8)
        except TypeError as exc:
            raise ValueError(
                f"A custom `worker` must accept 8 arguments. Got the signature {signature}; "
                f"besides, {fix}"
            ) from exc
    raise ValueError(f"worker={worker!r}: {fix}")


def check_whole_blocks(env_ids: list[int], size: int | None, operation: str) -> None:
    """Raise ValueError unless ``env_ids`` covers every row of each batched env (of
    ``size`` rows; ``None``: single envs, nothing to check) it touches."""
    if size is None or size == 1:  # single envs, or blocks that are always whole
        return
    counts: dict[int, int] = {}
    for env_id in env_ids:
        counts[env_id // size] = counts.get(env_id // size, 0) + 1
    partial = [block for block, count in counts.items() if count != size]
    if partial:
        block = min(partial)
        raise ValueError(
            f"cannot {operation} part of a batched env: envs {block * size}.."
            f"{block * size + size - 1} form one block (envs_per_block={size}) and step, "
            "reset and change together; address whole blocks (e.g. env_ids from "
            "recv(), which returns whole blocks)"
        )


def check_one_value_per_block(by_env: dict[int, Any], size: int | None, name: str) -> None:
    """Raise ValueError if ``set_attr`` gives the rows of one batched env (of ``size``
    rows) different values: a batched env has one attribute for all its rows."""
    if size is None or size == 1:
        return
    firsts: dict[int, Any] = {}
    for env_id, value in by_env.items():
        block = env_id // size
        if block not in firsts:
            firsts[block] = value
        elif not same_value(value, firsts[block]):
            raise ValueError(
                f"set_attr({name!r}) gives envs of one batched env (envs {block * size}.."
                f"{block * size + size - 1}) different values; a batched env has one "
                "attribute for all its rows: give each block one value"
            )


def resolve_env_ids(env_ids: Any, num_envs: int) -> list[int]:
    """``env_ids`` (a sequence or 1-D array of ints) as a list of distinct Python ints
    in ``0 .. num_envs - 1``, or a TypeError/ValueError naming what is wrong."""
    ids: list[int]
    if isinstance(env_ids, np.ndarray):
        if env_ids.ndim != 1 or (env_ids.size and env_ids.dtype.kind not in "iu"):
            raise TypeError(f"env_ids must be a 1-D sequence of ints, got {env_ids!r}")
        ids = env_ids.tolist()
    else:
        try:
            ids = list(env_ids)
        except TypeError:  # a lone int, say: not "'int' object is not iterable"
            raise TypeError(
                f"env_ids must be a 1-D sequence of ints, got {env_ids!r} "
                f"(for one env: [{env_ids!r}])"
            ) from None
        if not all(isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in ids):
            raise TypeError(f"env_ids must be a 1-D sequence of ints, got {env_ids!r}")
        ids = [int(i) for i in ids]
    if len(ids) == 1 and 0 <= ids[0] < num_envs:  # first-ready one env at a time
        return ids
    if not ids:
        raise ValueError("env_ids is empty: send at least one env id")
    if min(ids) < 0 or max(ids) >= num_envs:
        outside = [i for i in ids if not 0 <= i < num_envs]
        raise ValueError(f"env_ids {brief(outside)} are outside 0..{num_envs - 1}")
    if len(set(ids)) != len(ids):
        duplicates = sorted({i for i in ids if ids.count(i) > 1})
        raise ValueError(f"env_ids contain duplicates: {brief(duplicates)}")
    return ids


def env_id_rows(env_ids: Any, num_envs: int, *, distinct: bool = True) -> np.ndarray:
    """``env_ids`` of a learning-side call (a replay buffer's or a transition
    assembler's) as an int64 array of ids in ``0 .. num_envs - 1`` (distinct unless
    ``distinct=False``: ``ReplayBuffer.add`` takes an env's consecutive transitions in
    one call); empty is fine. Else a TypeError (a boolean mask, non-integers) or
    ValueError (out of range, duplicates) naming what is wrong; it reads nothing but its
    arguments, so a caller that checks first changes nothing on a refusal."""
    given = np.asarray(env_ids)
    if given.dtype == np.bool_:
        raise TypeError("env_ids is a boolean mask; pass the ids it selects: np.flatnonzero(mask)")
    if given.ndim != 1 or (given.size and given.dtype.kind not in "iu"):
        raise TypeError(f"env_ids must be a 1-D sequence of ints, got {env_ids!r}")
    rows = given.astype(np.int64)
    if rows.size and (rows.min() < 0 or rows.max() >= num_envs):
        # A negative id would silently index from the end (-1: the last env).
        raise ValueError(
            f"env_ids must be ids in 0..{num_envs - 1} (the {num_envs} envs this was built "
            f"for), got {env_ids!r}"
        )
    if distinct:
        ids, counts = np.unique(rows, return_counts=True)
        if (counts > 1).any():
            raise ValueError(
                f"env_ids contain duplicates: {brief(ids[counts > 1].tolist())}; give each "
                "env once per call"
            )
    return rows


def block_autoreset_mode(
    descriptions: list[EnvDescription], requested: AutoresetMode | None
) -> AutoresetMode:
    """The autoreset mode of batched envs (they autoreset themselves): their own, which
    ``requested`` (the caller's ``autoreset_mode``, if any) must equal."""
    modes = [
        AutoresetMode(d.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP))
        for d in descriptions
    ]
    mode = modes[0]
    for env_index, other in enumerate(modes):
        if other is not mode:
            raise ValueError(
                f"the batched envs autoreset in different modes ({mode} for env 0, {other} "
                f"for env {env_index}): one vector env has one autoreset mode, so build "
                "every block with the same one"
            )
    if requested is not None and requested is not mode:
        raise ValueError(
            f"autoreset_mode={requested} but the batched envs autoreset in {mode} mode "
            "(their metadata['autoreset_mode']): a batched env resets itself, so leave "
            "autoreset_mode out or build batched envs with the mode you want"
        )
    return mode


def is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


#: What an infinite time becomes where the runtime needs a number (a close timeout, a
#: spin window): ~31 years, which every clock and poll call takes (``inf`` overflows
#: some of them).
FOREVER = 1e9


def check_seconds(
    name: str,
    value: Any,
    *,
    positive: bool = False,
    negative_ok: bool = False,
    unlimited: float | None = None,
) -> float | None:
    """``value`` as a number of seconds the runtime can use: a Python ``float`` (numpy
    numbers of any precision included), ``None`` kept, and ``inf`` ("no limit") turned
    into ``unlimited``. It must be a real number, not a bool and not NaN, ``> 0`` with
    ``positive``, else ``>= 0`` unless ``negative_ok`` (a wait's timeout: a past
    deadline, as Gymnasium takes it).

    Raises:
        TypeError: not a number. ValueError: NaN, or out of range.
    """
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)):
        raise TypeError(_seconds_wanted(name, value, positive, negative_ok))
    if math.isnan(value) or (positive and value <= 0) or (not negative_ok and value < 0):
        raise ValueError(_seconds_wanted(name, value, positive, negative_ok))
    return unlimited if math.isinf(value) and value > 0 else float(value)


def _seconds_wanted(name: str, value: Any, positive: bool, negative_ok: bool) -> str:
    bound = "a positive" if positive else ("a" if negative_ok else "a non-negative")
    return f"{name} must be {bound} number of seconds (or None), got {value!r}"


def check_count(name: str, value: Any, minimum: int, *, none_ok: bool = False) -> None:
    """``value`` is an int (numpy integers count, bools do not) of at least ``minimum``,
    or ``None`` with ``none_ok``.

    Raises:
        TypeError: not an int. ValueError: below ``minimum``.
    """
    if value is None and none_ok:
        return
    if type(value) is int and value >= minimum:  # the usual case, checked first
        return
    wanted = f"{name} must be an int >= {minimum}{' (or None)' if none_ok else ''}, got {value!r}"
    if not is_int(value):
        raise TypeError(wanted)
    if value < minimum:
        raise ValueError(wanted)


def _bool_as_int(seed: Any) -> Any:
    """A Python bool seed as the int it equals (Gymnasium's envs take ``True`` as 1)."""
    return int(seed) if type(seed) is bool else seed


def env_seeds(seed: Any, num_envs: int) -> list[int | None]:
    """One seed (a Python int, or None) per env, from what ``reset(seed=...)`` accepts:
    ``None``, a non-negative int of any size (env ``i`` gets ``seed + i``), or one int or
    ``None`` per env (numpy integers count as ints, and Python's bools, as in Gymnasium).

    Raises:
        aiovec.InvalidSeedError: any other seed (also a ``gymnasium.error.Error``, as
            Gymnasium's envs raise for one).
    """
    if seed is None:
        return [None] * num_envs
    seed = _bool_as_int(seed)
    if is_int(seed):
        if seed < 0:
            raise InvalidSeedError(f"seed must be a non-negative int, got {seed!r}")
        return [int(seed) + i for i in range(num_envs)]  # as Gymnasium seeds env i
    if isinstance(seed, (str, bytes, dict)) or not hasattr(seed, "__len__"):
        raise InvalidSeedError(
            f"seed must be None, a non-negative int, or a list of {num_envs} such seeds "
            f"(one per env), got {seed!r}"
        )
    seeds = list(seed)
    if len(seeds) != num_envs:
        raise InvalidSeedError(
            f"If seeds are passed as a list the length must match num_envs={num_envs} "
            f"but got length={len(seeds)}."
        )
    for index, item in enumerate(seeds):
        seeds[index] = item = _bool_as_int(item)
        if item is not None and not (is_int(item) and item >= 0):
            raise InvalidSeedError(
                f"seed[{index}] is {item!r}: each seed must be None or a non-negative int"
            )
    return [None if item is None else int(item) for item in seeds]


def check_name(name: Any, operation: str) -> None:
    if not isinstance(name, str):
        raise TypeError(
            f"{operation}() needs the name of an env attribute or method as a str, "
            f"got {name!r}; use apply(function) to run a function on each env"
        )


def check_max_envs(max_envs: int | None) -> None:
    """``recv``'s ``max_envs``: ``None`` or a positive int (numpy integers count)."""
    if max_envs is None or (type(max_envs) is int and max_envs >= 1):  # the usual cases
        return
    if not is_int(max_envs) or max_envs < 1:
        raise ValueError(
            f"max_envs must be a positive int number of envs (or None), got {max_envs!r}"
        )


def brief(env_ids: list[int], shown: int = 10) -> str:
    """``env_ids`` for a message: all of them, or the first few and how many in all."""
    if len(env_ids) <= shown:
        return str(env_ids)
    return f"[{', '.join(map(str, env_ids[:shown]))}, ... ({len(env_ids)} in all)]"


def take_reset_mask(options: Any) -> None:
    """Take ``"reset_mask"`` out of the options dict of a reset that was started, as
    Gymnasium's vector envs do (``RecordEpisodeStatistics``, among others, tells a full
    reset from a partial one by the key still being there)."""
    if isinstance(options, MutableMapping):
        options.pop("reset_mask", None)


def reset_mask_ids(reset_mask: Any, num_envs: int) -> list[int]:
    if not isinstance(reset_mask, np.ndarray):
        raise TypeError(f"`options['reset_mask']` must be a numpy array, got {type(reset_mask)}")
    if reset_mask.shape != (num_envs,):
        raise ValueError(
            f"`options['reset_mask']` must have shape `({num_envs},)`, got {reset_mask.shape}"
        )
    if reset_mask.dtype != np.bool_:
        raise TypeError(
            f"`options['reset_mask']` must have `dtype=np.bool_`, got {reset_mask.dtype}"
        )
    if not reset_mask.any():
        raise ValueError(
            "`options['reset_mask']` must contain a boolean array with at least one True value, "
            f"got reset_mask={reset_mask}"
        )
    return np.flatnonzero(reset_mask).tolist()
