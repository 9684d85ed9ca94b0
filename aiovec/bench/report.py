"""Benchmark results as a markdown table, JSON, and PNG plots."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any, cast

import numpy as np

from aiovec.bench.suite import MachineResult, MemoryResult, WorkloadResult

SYNC, ASYNC = "gymnasium SyncVectorEnv", "gymnasium AsyncVectorEnv"


def _ratio(value: float, reference: float | None) -> str:
    return f"{value / reference:.2f}x" if reference else "-"


def workload_table(result: WorkloadResult) -> str:
    """A markdown table of one workload: medians and ratios to Gymnasium in the same run."""
    sync, asynchronous = result.find(SYNC), result.find(ASYNC)
    per_step = result.metric == "us/step"
    header = ["contender", "us per vector step" if per_step else "steps/s (median)"]
    header += ["vs Sync", "vs Async", "CPU us/env-step"]
    if result.ideal:
        header.append("of ideal")
    if result.bytes_per_step:
        header.append("MB/s")
    memory = any(entry.memory_per_env is not None for entry in result.results)
    if memory:
        header.append("memory per env")
    lines = [f"### {result.title}", "", "| " + " | ".join(header) + " |"]
    lines.append("|" + "---|" * len(header))
    for entry in result.results:
        if not entry.rates:
            lines.append(f"| {entry.name} | failed: {entry.error} |" + " |" * (len(header) - 2))
            continue
        value = result.value(entry)
        if per_step:  # lower is better: ratio = theirs / ours would invert; show ours / theirs
            row = [entry.name, f"{value:,.1f}"]
            row += [
                _ratio(value, result.value(ref)) if ref else "-" for ref in (sync, asynchronous)
            ]
        else:
            row = [entry.name, f"{value:,.0f}"]
            row += [_ratio(value, ref.rate) if ref else "-" for ref in (sync, asynchronous)]
        row.append(f"{entry.cpu_us_per_step:,.0f}" if entry.cpu_us_per_step else "-")
        if result.ideal:
            row.append(f"{entry.rate / result.ideal:.2f}")
        if result.bytes_per_step:
            row.append(f"{entry.rate * result.bytes_per_step / 1e6:,.0f}")
        if memory:
            per_env = entry.memory_per_env
            row.append(f"{per_env / 1024:,.1f} KiB" if per_env is not None else "-")
        lines.append("| " + " | ".join(row) + " |")
    if per_step:
        lines += ["", "Ratios for per-step overhead are ours / theirs: below 1 is faster."]
    with_breakdown = [entry for entry in result.results if entry.breakdown]
    if with_breakdown:
        lines += [
            "",
            "Where aiovec's time went (`VecEnv.stats()` over the timed windows), us per "
            "env-step: `agent` is aiovec's own work in this process, `env` the envs' "
            "time in their hosts (summed over envs stepped at once), `wait` this process "
            "waiting for workers; latency is send to result.",
            "",
            "| contender | agent | env | wait | step latency p50 | p99 |",
            "|---|---|---|---|---|---|",
        ]
        for entry in with_breakdown:
            b = cast("dict[str, float]", entry.breakdown)  # kept for having one
            lines.append(
                f"| {entry.name} | {b['agent']:,.1f} | {b['env']:,.1f} | {b['wait']:,.1f} "
                f"| {b['latency_p50']:,.0f} us | {b['latency_p99']:,.0f} us |"
            )
    return "\n".join(lines)


def memory_table(results: list[MemoryResult]) -> str:
    reference = next((r.bytes for r in results if r.name == ASYNC), None)
    count = results[0].num_envs if results else 64
    lines = [f"### Memory: {count} CartPole-v1 envs, all processes (proportional set size)", ""]
    lines += ["| contender | MiB | vs Async |", "|---|---|---|"]
    for entry in results:
        lines.append(
            f"| {entry.name} | {entry.bytes / 2**20:,.1f} | {_ratio(entry.bytes, reference)} |"
        )
    return "\n".join(lines)


def machine_table(machine: MachineResult) -> str:
    return "\n".join(
        [
            "### This machine, measured in the same run",
            "",
            "| cores | bare CartPole step | in-process ceiling (cores / step) | pipe round trip |",
            "|---|---|---|---|",
            f"| {machine.cores} | {machine.bare_step_us:.1f} us | "
            f"{machine.ceiling_steps_per_s:,.0f} steps/s | {machine.pipe_round_trip_us:.1f} us |",
        ]
    )


def to_json(
    workloads: list[WorkloadResult], memory: list[MemoryResult] | None, machine: MachineResult
) -> dict[str, Any]:
    """Everything measured, with recv latencies summarised as percentiles."""
    encoded = []
    for workload in workloads:
        item = asdict(workload)
        for entry, source in zip(item["results"], workload.results):
            latencies = entry.pop("recv_latencies")
            entry["median_steps_per_s"] = source.rate
            if latencies:
                entry["recv_latency_us"] = {
                    f"p{q}": float(np.percentile(latencies, q) * 1e6) for q in (50, 90, 99)
                }
        encoded.append(item)
    return {
        "machine": asdict(machine),
        "workloads": encoded,
        "memory": [asdict(m) for m in memory] if memory else None,
    }


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2))


def plot(workloads: list[WorkloadResult], folder: Path) -> list[Path]:
    """``throughput.png`` (steps/s per contender and workload) and, when first-ready
    latencies were recorded, ``recv_latency_cdf.png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    figure, axes = plt.subplots(
        len(workloads), 1, figsize=(9, 1.2 + 0.45 * sum(len(w.results) for w in workloads))
    )
    axes = np.atleast_1d(axes)
    for axis, workload in zip(axes, workloads):
        entries = [r for r in workload.results if r.rates]
        colors = [
            "tab:blue"
            if r.library == "aiovec"
            else "tab:gray"
            if r.library == "gymnasium"
            else "tab:olive"
            for r in entries
        ]
        axis.barh([r.name for r in entries], [r.rate for r in entries], color=colors)
        if workload.ideal:
            axis.axvline(workload.ideal, color="tab:red", linestyle="--", label="ideal")
            axis.legend(loc="lower right")
        axis.set_xscale("log")
        axis.set_title(workload.title, fontsize=9)
        axis.set_xlabel("env steps per second (median, log scale)")
        axis.tick_params(axis="y", labelsize=8)
    figure.tight_layout()
    path = folder / "throughput.png"
    figure.savefig(path, dpi=110)
    plt.close(figure)
    written.append(path)

    with_latencies = [(w, r) for w in workloads for r in w.results if r.recv_latencies]
    if with_latencies:
        figure, axis = plt.subplots(figsize=(7, 4))
        for workload, entry in with_latencies:
            values = np.sort(np.asarray(entry.recv_latencies) * 1e3)
            axis.plot(values, np.linspace(0, 1, len(values)), label=f"{workload.key} {entry.name}")
        axis.set_xscale("log")
        axis.set_xlabel("recv() wait (ms, log scale)")
        axis.set_ylabel("fraction of calls")
        axis.set_title("First-ready recv latency CDF")
        axis.legend(fontsize=7)
        figure.tight_layout()
        path = folder / "recv_latency_cdf.png"
        figure.savefig(path, dpi=110)
        plt.close(figure)
        written.append(path)
    return written
