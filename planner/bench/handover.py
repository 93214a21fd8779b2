"""`pplan bench handover`: what one hand-over between two CPU ranks costs, idle and while every
core computes, as a table (the measurement is planner.execute.handover's, which `pplan calibrate
--machine` fits the machine's hand-over cost from)."""

from __future__ import annotations

from typing import Callable

from planner.bench.table import Table
from planner.execute.handover import COLUMNS, FULL, MATMUL_N, QUICK, HandoverSettings, measure_handover
from planner.hostinfo import load_average

__all__ = ["HandoverSettings", "FULL", "QUICK", "bench_handover", "COLUMNS"]


def _notes(settings: HandoverSettings, ops: int, load_start: float | None, load_end: float | None) -> tuple[str, ...]:
    return (
        f"Two processes, gloo on 127.0.0.1, one torch thread each; {settings.reps} exchanges per rank and cell after "
        f"{settings.warmup} unrecorded; uni: rank 0 sends to rank 1, bidir: both send to each other at once.",
        "A sample is what one rank lost in one exchange; both ranks' samples are pooled (samples = 2 x exchanges).",
        "idle: time from posting the exchange to the end of its wait, with both ranks doing nothing else.",
        f"compute: both ranks post the exchange, then run a fixed work ({ops} matmuls of {MATMUL_N} x {MATMUL_N}, "
        f"work_ms its median alone), then wait; the cost is post + work + wait minus the median of the same work "
        "with nothing posted, interleaved with it in the same run. It is a difference: noise can make a sample "
        "(and, with little to measure, a median) slightly negative.",
        "wait_mean_ms: mean wait after the work (bytes still moving when the compute ended). off_cpu_mean_ms: how "
        "much longer, on average, the compute thread was off its core during the work (wall minus thread CPU "
        "time) with the exchange posted than without.",
        f"Load average (1 min) at start {load_start}, at end {load_end}: other work on the machine adds to both modes.",
        "Hypothesis under test, not a finding: gloo moves the bytes on its own background thread; when every core "
        "runs a rank's compute thread, that thread (or the compute thread it displaces) waits for a scheduler "
        "slice (several ms), so a hand-over that costs ~0.1 ms idle sometimes costs milliseconds under compute. "
        "It predicts compute rows with a larger share over 1 ms than idle rows, carried by wait_mean_ms and/or "
        "off_cpu_mean_ms; a schedule with more cross-rank hand-overs (interleaved) would then pay more of it.",
    )


def bench_handover(settings: HandoverSettings = FULL, progress: Callable[[str], None] | None = None) -> Table:
    """Measure the hand-over cost on this machine with two local ranks; one row per (mode, direction, size)."""
    load_start = load_average()
    rows, ops = measure_handover(settings, progress)
    load_end = load_average()
    summary = {"load_start": load_start, "load_end": load_end, "work_matmuls": ops, "reps": settings.reps}
    return Table(name="handover", title="Hand-over between two CPU ranks (gloo, loopback): idle vs every core computing",
                 columns=COLUMNS, rows=tuple(rows), notes=_notes(settings, ops, load_start, load_end), summary=summary)
