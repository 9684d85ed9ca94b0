"""The ``aiovec`` command: ``aiovec bench`` and ``aiovec tune ENV_ID``."""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

DEFAULT_WORKLOADS = "W1,W3"


@contextmanager
def _progress(enabled: bool) -> Iterator[Callable[[str], None]]:
    """A rich spinner with a changing description; yields ``describe(text)``."""
    if not enabled:
        yield lambda text: None
        return
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(
        SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), transient=True
    ) as progress:
        task = progress.add_task("starting", total=None)
        yield lambda text: progress.update(task, description=text)


def _whole_number(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _counts(text: str) -> list[int]:
    counts = [_whole_number(part.strip()) for part in text.split(",") if part.strip()]
    if not counts:
        raise argparse.ArgumentTypeError(f"names no count ({text!r}); e.g. 8 or 8,64")
    return counts


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def _workload_keys(text: str) -> list[str]:
    from aiovec.bench.workloads import WORKLOAD_KEYS, unknown_workload

    keys = [key.strip() for key in text.split(",") if key.strip()]
    if not keys:
        raise argparse.ArgumentTypeError(
            f"names no workload ({text!r}); choose from {', '.join(WORKLOAD_KEYS)}"
        )
    for key in keys:
        if key.upper() not in WORKLOAD_KEYS:
            raise argparse.ArgumentTypeError(unknown_workload(key))
    return keys


def _check_before_running(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """What the arguments name must exist (an env id) or be creatable (the output
    folders) before anything is measured: a mistake ends the command as a usage error
    (exit status 2), never minutes later or with a traceback."""
    from gymnasium.envs.registration import load_env_creator
    from gymnasium.error import Error as GymnasiumError

    from aiovec._make import registry_spec

    env_id = getattr(args, "env_id", None)
    if env_id is not None:
        name = "--env-id" if args.command == "bench" else "env_id"
        try:
            spec = registry_spec(env_id)
        except (GymnasiumError, ImportError) as exc:
            parser.error(f"argument {name}: {exc}")
        if isinstance(spec.entry_point, str):  # e.g. an extra not installed (Box2D)
            try:
                load_env_creator(spec.entry_point)
            except (GymnasiumError, ImportError, AttributeError) as exc:
                parser.error(
                    f"argument {name}: cannot load {env_id}'s entry point "
                    f"{spec.entry_point!r}: {type(exc).__name__}: {exc}"
                )
    folders = []
    if args.command == "bench":
        folders.append(("--out", Path(args.out)))
        if args.json:
            if Path(args.json).is_dir():
                parser.error(f"argument --json: {args.json} is a folder; name a file in it")
            folders.append(("--json", Path(args.json).parent))
    for name, folder in folders:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            parser.error(f"argument {name}: cannot create the folder {folder}: {exc}")


def bench(args: argparse.Namespace) -> int:
    from aiovec.bench import report, suite, workloads

    keys = args.workloads
    counts: list[int | None] = list(args.num_envs) if args.num_envs else [None]
    selected = []
    for key in keys:
        if key.lower() in ("memory", "replay"):
            continue
        for count in counts:
            selected += workloads.workload(key, count, args.env_id, args.ray)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    memory = None
    with _progress(not args.quiet) as describe:
        describe("measuring this machine")
        machine = suite.run_machine(args.env_id or "CartPole-v1")
        for workload in selected:
            results.append(suite.run_workload(workload, args.seconds, args.repeats, describe))
        if any(key.lower() == "memory" for key in keys):
            # --num-envs counts here too (its first value); 64 envs otherwise.
            memory = suite.run_memory(counts[0] or 64, progress=describe)
        replay = None
        if any(key.lower() == "replay" for key in keys):
            from aiovec.bench.replay import run_replay

            replay = run_replay(args.seconds, args.repeats, describe)
    sections = [report.machine_table(machine)]
    sections += [report.workload_table(result) for result in results]
    if memory:
        sections.append(report.memory_table(memory))
    if replay:
        from aiovec.bench.replay import replay_table

        sections.append(replay_table(replay))
    text = "\n\n".join(sections) + "\n"
    print(text)
    (out / "results.md").write_text(text)
    written = [out / "results.md"]
    if results and not args.no_plots:
        written += report.plot(results, out)
    data = report.to_json(results, memory, machine)
    if replay:
        data["replay"] = [
            {
                "name": entry.name,
                "insert_per_s": entry.insert_rate,
                "samples_per_s": entry.sample_rate,
                "samples_with_updates_per_s": (
                    statistics.median(entry.sample_update_rates)
                    if entry.sample_update_rates
                    else None
                ),
            }
            for entry in replay
        ]
    report.write_json(out / "results.json", data)  # first: the run is kept whatever follows
    written.append(out / "results.json")
    if args.json:
        report.write_json(Path(args.json), data)
        written.append(Path(args.json))
    print("wrote " + ", ".join(str(path) for path in written))
    return 0


def tune(args: argparse.Namespace) -> int:
    import aiovec

    cores = os.cpu_count() or 1
    workers_grid = sorted({1, *range(2, cores + 1), 2 * cores})
    per_worker_grid = [1, 4, 16]
    configs: list[dict[str, Any]] = [
        {"backend": "process", "num_workers": w, "num_envs": w * k}
        for w in workers_grid
        for k in per_worker_grid
    ]
    configs += [
        {"backend": "inline", "num_envs": n} for n in sorted({cores * k for k in per_worker_grid})
    ]
    if cores > 1:  # cores - 1 workers, and this process steps an equal share itself
        configs += [
            {
                "backend": "process",
                "num_workers": cores - 1,
                "inline_envs": k,
                "num_envs": cores * k,
            }
            for k in per_worker_grid
        ]
    rows = []
    with _progress(not args.quiet) as describe:
        for config in configs:
            options = dict(config)
            num_envs = options.pop("num_envs")
            describe(f"tune {args.env_id}: {num_envs} envs, {options}")
            rate, window = _measure(
                aiovec, args.env_id, num_envs, options, args.seconds, args.repeats
            )
            rows.append((rate, num_envs, config, window))
    rows.sort(key=lambda row: row[0], reverse=True)
    # From VecEnv.stats() over the timed windows: aiovec's own cost per env-step in this
    # process, and how much of the time this process waited for workers.
    print(
        "| steps/s (median) | num_envs | backend | num_workers | inline_envs "
        "| aiovec us/env-step | waiting |"
    )
    print("|---|---|---|---|---|---|---|")
    for rate, num_envs, config, window in rows:
        waiting = window.wait_time / window.elapsed if window.elapsed else 0.0
        print(
            f"| {rate:,.0f} | {num_envs} | {config['backend']} "
            f"| {config.get('num_workers', '-')} | {config.get('inline_envs', '-')} "
            f"| {window.per_env_step()['agent']:.1f} | {waiting:.0%} |"
        )
    rate, num_envs, config, window = rows[0]
    call = f'aiovec.make("{args.env_id}", num_envs={num_envs}, backend="{config["backend"]}"'
    for option in ("num_workers", "inline_envs"):
        if option in config:
            call += f", {option}={config[option]}"
    print(f"\nrecommended on this machine ({rate:,.0f} steps/s):\n    {call})")
    waiting = window.wait_time / window.elapsed if window.elapsed else 0.0
    if waiting > 0.3:
        print(
            f"this process waits {waiting:.0%} of the time for its workers: giving it a "
            "share of the envs (inline_envs=) or more envs per worker may pay"
        )
    return 0


def _measure(
    aiovec: Any, env_id: str, num_envs: int, options: dict[str, Any], seconds: float, repeats: int
) -> tuple[float, Any]:
    """Median steps/s over ``repeats`` windows, and ``VecEnv.stats()`` over them."""
    with aiovec.make(env_id, num_envs, **options) as envs:
        envs.reset(seed=0)
        envs.action_space.seed(0)
        actions = [envs.action_space.sample() for _ in range(8)]
        rates = []
        for window in range(repeats + 1):  # the first window warms up
            if window == 1:
                before = envs.stats()
            steps, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                envs.step(actions[steps % len(actions)])
                steps += 1
            if window:
                rates.append(steps * num_envs / (time.perf_counter() - start))
        return statistics.median(rates), envs.stats() - before


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="aiovec", description="aiovec command-line tools")
    commands = parser.add_subparsers(dest="command", required=True)

    bench_parser = commands.add_parser(
        "bench",
        help="compare aiovec with Gymnasium (and SB3 if installed) on built-in workloads",
        description="Runs workloads W1-W8 (and 'memory') and reports medians of repeated "
        "windows, as ratios to Gymnasium's vector envs measured in the same run.",
    )
    bench_parser.add_argument(
        "--workloads",
        type=_workload_keys,
        default=DEFAULT_WORKLOADS,
        help="comma-separated: W1 (CartPole), W2 (no-op overhead), W3 (IO latency), "
        "W4 (CPU latency), W5 (large observations), W6 (async envs at 1,000 and 10,000), "
        "W7 (batched CartPole, 4,096 envs in blocks), W8 (imagination: a torch model in "
        "blocks), spin (spinning next to a busy process), memory, replay (replay-buffer "
        "insert/sample rates) (default: %(default)s)",
    )
    bench_parser.add_argument("--env-id", default=None, help="env id for W1 (default CartPole-v1)")
    bench_parser.add_argument(
        "--num-envs",
        type=_counts,
        default=None,
        help="comma-separated env counts instead of each workload's own (memory: the first)",
    )
    bench_parser.add_argument("--seconds", type=_seconds, default=0.4, help="length of one window")
    bench_parser.add_argument(
        "--repeats", type=_whole_number, default=3, help="windows per contender"
    )
    bench_parser.add_argument("--out", default="bench-results", help="output folder")
    bench_parser.add_argument("--json", default=None, help="also write the JSON results here")
    bench_parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    bench_parser.add_argument(
        "--ray",
        action="store_true",
        help="add Ray rows to W1 and W3 (aiovec's Ray backend and one-actor-per-env Ray "
        "stepping; starts a local Ray, which takes a few seconds)",
    )
    bench_parser.add_argument("--quiet", action="store_true", help="no progress display")
    bench_parser.set_defaults(handler=bench, parser=bench_parser)

    tune_parser = commands.add_parser(
        "tune",
        help="find the fastest num_envs / workers / backend for an env on this machine",
    )
    tune_parser.add_argument("env_id", help="a Gymnasium id, e.g. CartPole-v1")
    tune_parser.add_argument("--seconds", type=_seconds, default=0.3, help="length of one window")
    tune_parser.add_argument(
        "--repeats", type=_whole_number, default=2, help="windows per configuration"
    )
    tune_parser.add_argument("--quiet", action="store_true", help="no progress display")
    tune_parser.set_defaults(handler=tune, parser=tune_parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _check_before_running(args, args.parser)  # a mistake shows the subcommand's usage
    try:
        return cast(int, args.handler(args))  # every subcommand's handler returns an exit code
    except KeyboardInterrupt:
        # The user's Ctrl-C, after everything the run started was closed (see
        # aiovec.bench.suite): a traceback would only show where it happened to land.
        print(f"aiovec {args.command}: interrupted (Ctrl-C); nothing was written", file=sys.stderr)
        return 130  # the shell's code for a command ended by SIGINT


if __name__ == "__main__":
    sys.exit(main())
