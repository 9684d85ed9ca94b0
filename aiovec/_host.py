"""Runs commands on a group of envs: the one place where envs are reset, stepped and called.

Both the in-process backend and the subprocess worker drive an :class:`EnvHost`, so
autoreset semantics and error capture are written once and are identical everywhere.
An exception raised by one env is captured per env; the other envs of the command run
normally.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

import gymnasium as gym
from gymnasium.vector import AutoresetMode

from aiovec._buffers import Buffers
from aiovec._protocol import Call, Command, ErrorInfo, Reply, Reset, SetAttr, Step
from aiovec._spaces import is_shareable, read_row, row_writer


def error_info(env_id: int, operation: str, exc: BaseException) -> ErrorInfo:
    """Capture ``exc`` (raised by env ``env_id``) with its formatted traceback."""
    return ErrorInfo(
        env_id=env_id,
        operation=operation,
        exc_type=type(exc).__qualname__,
        message=str(exc),
        traceback="".join(traceback.format_exception(exc)),
    )


class EnvBuildError(Exception):
    """An env factory raised; carries the captured error."""

    def __init__(self, info: ErrorInfo) -> None:
        super().__init__(info.message)
        self.info = info


def build_envs(env_fns: dict[int, Callable[[], gym.Env]]) -> dict[int, gym.Env]:
    """Call each factory; on the first failure close what was built and raise EnvBuildError."""
    envs: dict[int, gym.Env] = {}
    for env_id, env_fn in env_fns.items():
        try:
            env = env_fn()
            if not isinstance(env, gym.Env):
                raise TypeError(
                    f"the env factory returned {type(env).__name__}, not a gymnasium.Env; "
                    "it must be a callable that creates one env"
                )
        except Exception as exc:
            for built in envs.values():
                _close_quietly(built)
            raise EnvBuildError(error_info(env_id, "make", exc)) from exc
        envs[env_id] = env
    return envs


def describe(env: gym.Env) -> tuple[Any, ...]:
    """What the vector env needs to know about an env: spaces, metadata, render mode, spec."""
    return (env.observation_space, env.action_space, dict(env.metadata), env.render_mode, env.spec)


class EnvHost:
    """Executes :mod:`aiovec._protocol` commands on ``envs`` (keyed by global env id).

    With ``env_fns`` and ``max_restarts > 0``, an env that raises in ``step`` is rebuilt
    from its factory, reset, and answers that step with its fresh observation,
    ``truncated=True`` and ``info["restarted"] = True`` (plus ``"restart_reason"``),
    unless it failed more than ``max_restarts`` times in a row: then the error is
    reported as usual. :meth:`notify_restart` gives every env the same treatment on its
    next step (used when a whole worker was rebuilt).
    """

    def __init__(
        self,
        envs: dict[int, gym.Env],
        autoreset_mode: AutoresetMode,
        buffers: Buffers | None,
        env_fns: dict[int, Callable[[], gym.Env]] | None = None,
        max_restarts: int = 0,
    ) -> None:
        self.envs = envs
        self.autoreset_mode = autoreset_mode
        self._env_fns = env_fns or {}
        self._max_restarts = max_restarts if env_fns else 0
        self._failures_in_a_row = dict.fromkeys(envs, 0)
        self._restart_notices: dict[int, str] = {}  # env id -> why it was rebuilt
        self._observation_space = next(iter(envs.values())).observation_space
        self._needs_reset = dict.fromkeys(envs, False)
        # Observations of spaces that are not in shared memory, sent back in the reply.
        self._observations: dict[int, Any] | None = (
            None if is_shareable(self._observation_space) else {}
        )
        if buffers is not None:
            self.attach(buffers)

    def attach(self, buffers: Buffers) -> None:
        """Use ``buffers`` for actions and results; required before the first command."""
        self.buffers = buffers
        if self._observations is None:
            self._write_row = row_writer(self._observation_space, buffers.observations)

    def execute(self, command: Command) -> Reply:
        """Run ``command`` on each of its envs and describe the outcome."""
        env_ids = command.env_ids
        infos: list[Any] = [None] * len(env_ids)
        values: list[Any] | None = None
        errors: list[ErrorInfo] | None = None
        self._progressed = not isinstance(command, Step)  # a step must prove it
        if isinstance(command, Step):
            operation = "step"
            for position, env_id in enumerate(env_ids):
                action = (
                    read_row(self.buffers.actions, env_id)
                    if command.actions is None
                    else command.actions[position]
                )
                try:
                    infos[position] = self._step(env_id, action)
                except Exception as exc:
                    try:
                        infos[position] = self._recover(env_id, exc)
                    except Exception as final:
                        errors = (errors or []) + [error_info(env_id, operation, final)]
        elif isinstance(command, Reset):
            operation = "reset"
            for position, env_id in enumerate(env_ids):
                options = command.options
                if command.per_env_options:
                    options = options[position]
                try:
                    infos[position] = self._reset(env_id, command.seeds[position], options)
                except Exception as exc:
                    errors = (errors or []) + [error_info(env_id, operation, exc)]
        elif isinstance(command, Call):
            values = [None] * len(env_ids)
            for position, env_id in enumerate(env_ids):
                try:
                    args, kwargs = command.args or (), command.kwargs or {}
                    if command.function is not None:
                        values[position] = command.function(self.envs[env_id], *args, **kwargs)
                        continue
                    attribute = self.envs[env_id].get_wrapper_attr(command.name)
                    values[position] = (
                        attribute(*args, **kwargs) if callable(attribute) else attribute
                    )
                except Exception as exc:
                    errors = (errors or []) + [error_info(env_id, command.name, exc)]
        elif isinstance(command, SetAttr):
            for position, env_id in enumerate(env_ids):
                try:
                    self.envs[env_id].set_wrapper_attr(command.name, command.values[position])
                except Exception as exc:
                    errors = (errors or []) + [error_info(env_id, f"set_attr {command.name}", exc)]
        else:
            raise TypeError(f"unexpected command {command!r}")

        observations = None
        if self._observations is not None and isinstance(command, (Step, Reset)):
            observations = [self._observations.get(env_id) for env_id in env_ids]
        return Reply(
            seq=command.seq,
            env_ids=env_ids,
            infos=infos if any(infos) else None,
            values=values,
            observations=observations,
            errors=errors,
            progressed=self._progressed,
        )

    def _reset(self, env_id: int, seed: int | None, options: dict | None) -> dict:
        self._restart_notices.pop(env_id, None)  # a reset answers for any restart
        observation, info = self.envs[env_id].reset(seed=seed, options=options)
        self._write_observation(env_id, observation)
        self.buffers.terminations[env_id] = False
        self.buffers.truncations[env_id] = False
        self._needs_reset[env_id] = False
        return info

    def notify_restart(self, reason: str) -> None:
        """Every env's next step reports a restart (its env was just rebuilt)."""
        self._restart_notices = dict.fromkeys(self.envs, reason)

    def _recover(self, env_id: int, exc: Exception) -> dict:
        """Rebuild env ``env_id`` after ``exc`` and answer with its reset; re-raise
        ``exc`` when restarting is off or the env keeps failing."""
        self._failures_in_a_row[env_id] += 1
        if self._failures_in_a_row[env_id] > self._max_restarts:
            raise exc
        _close_quietly(self.envs[env_id])
        self.envs[env_id] = self._env_fns[env_id]()
        return self._restarted_step(env_id, f"{type(exc).__qualname__}: {exc}")

    def _restarted_step(self, env_id: int, reason: str) -> dict:
        observation, info = self.envs[env_id].reset()
        self._write_observation(env_id, observation)
        self.buffers.rewards[env_id] = 0.0
        self.buffers.terminations[env_id] = False
        self.buffers.truncations[env_id] = True
        # NEXT_STEP treats the truncation like any other: the next step resets again.
        self._needs_reset[env_id] = self.autoreset_mode is AutoresetMode.NEXT_STEP
        return {**info, "restarted": True, "restart_reason": reason}

    def _step(self, env_id: int, action: Any) -> dict:
        if self._restart_notices:
            reason = self._restart_notices.pop(env_id, None)
            if reason is not None:
                return self._restarted_step(env_id, reason)
        env = self.envs[env_id]
        stepped = not (self.autoreset_mode is AutoresetMode.NEXT_STEP and self._needs_reset[env_id])
        if not stepped:
            observation, info = env.reset()
            reward, terminated, truncated = 0.0, False, False
        else:
            observation, reward, terminated, truncated, info = env.step(action)
            if self.autoreset_mode is AutoresetMode.SAME_STEP and (terminated or truncated):
                final = {"final_obs": observation, "final_info": info}
                observation, reset_info = env.reset()
                info = {**final, **reset_info}
        self._write_observation(env_id, observation)
        self.buffers.rewards[env_id] = reward
        self.buffers.terminations[env_id] = terminated
        self.buffers.truncations[env_id] = truncated
        self._needs_reset[env_id] = bool(terminated or truncated)
        if stepped:  # a real step went through: whatever failed before is not a loop
            self._failures_in_a_row[env_id] = 0
            self._progressed = True
        return info

    def _write_observation(self, env_id: int, observation: Any) -> None:
        if self._observations is not None:
            self._observations[env_id] = observation
            return
        try:
            self._write_row(env_id, observation)
        except (ValueError, TypeError) as exc:
            raise ValueError(
                f"the env returned an observation that does not fit its observation_space: {exc}"
            ) from None

    def close(self) -> None:
        """Close every env, ignoring their errors (closing must always finish)."""
        for env in self.envs.values():
            _close_quietly(env)


def _close_quietly(env: gym.Env) -> None:
    try:
        env.close()
    except Exception:
        pass
