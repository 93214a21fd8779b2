"""`pplan bench planner --parallel`: seconds for the full data x pipeline x tensor search at scale.

Each case builds the analytic profile of a GPT on A100s and runs the whole `auto` search
(every dp x pp x tp layout, micro-batch size, schedule and recompute, the pipeline DP per
layout, the best few simulated). The targets are the issue's: the 1T-parameter GPT on 3,072
GPUs in under 10 s, a 175B GPT on 1,536 GPUs in under 5 s, on this 2-core machine.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from planner.bench.table import Table

__all__ = ["ParallelCase", "PARALLEL_CASES", "bench_parallel"]


@dataclass(frozen=True)
class ParallelCase:
    """One search to time."""

    name: str
    """Row label."""
    model: str
    """Built-in gpt spec."""
    nodes: int
    """Nodes of 8 A100-80GB."""
    global_batch: int
    """Samples per iteration."""
    target_s: float
    """Seconds the search should stay under."""


PARALLEL_CASES = (
    ParallelCase("gpt-175B", "gpt:layers=96,hidden=12288,heads=96,seq=2048,vocab=51200", 192, 1536, 5.0),
    ParallelCase("gpt-1T", "gpt:layers=128,hidden=25600,heads=160,seq=2048,vocab=51200", 384, 3072, 10.0),
)


def bench_parallel(cases: tuple[ParallelCase, ...] = PARALLEL_CASES,
                   progress: Callable[[str], None] | None = None) -> Table:
    """Time each case's analytic profile plus full auto search (one run each, wall clock)."""
    from planner.hardware import load_hardware
    from planner.partition.parallel_search import plan_parallel
    from planner.profiling.analytic import analytic_profile

    hw = load_hardware("a100-80gb")
    rows = []
    for case in cases:
        if progress:
            progress(f"{case.name}: {case.nodes * 8} GPUs")
        start = time.perf_counter()
        profile = analytic_profile(case.model, hw, "bfloat16", [1, 2, 4, 8])
        result = plan_parallel(profile, hardware=hw, nodes=case.nodes, gpus_per_node=8, global_batch=case.global_batch)
        seconds = time.perf_counter() - start
        best = result.best
        rows.append((case.name, case.nodes * 8, result.layouts, result.solved, seconds, case.target_s,
                     best.config.describe(), f"{best.schedule} b={best.micro_batch_size}", best.tflops_per_gpu))
    return Table(
        name="planner_parallel",
        title="Full dp x pp x tp search at scale (analytic A100-80GB profile included)",
        columns=("case", "GPUs", "layouts", "points priced", "seconds", "target s", "best layout", "schedule", "TFLOP/s/GPU"),
        rows=tuple(rows),
        notes=("One wall-clock run per case on this machine; compare seconds with the target, not across machines.",),
        summary={"max_seconds_over_target": max(r[4] / r[5] for r in rows)},
    )
