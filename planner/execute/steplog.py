"""What one rank measured step by step, and the measurement of it that rank 0 gathers.

planner.execute.train fills a StepLog as it trains; rank_measurement turns it into the rank's
RankMeasurement (planner.execute.measurement), which travels to rank 0, where
planner.execute.results reads it into the run JSON.
"""

from __future__ import annotations

import socket
import statistics
from dataclasses import dataclass, field
from typing import Any

import torch

from planner.execute.measurement import ActionSpan, CommMeasurement, RankMeasurement, RankMemory
from planner.execute.stages import rank_device
from planner.plan import Plan

__all__ = ["StepLog", "rank_measurement", "action_medians"]


@dataclass
class StepLog:
    """One rank's measurements, one entry per step trained (mutable: the training loop appends
    to it step by step; it never leaves the rank, rank_measurement does)."""

    step_ms: list[float] = field(default_factory=list)
    """Each step's time, the slowest rank's (all ranks agree on it), ms."""
    step_t0: list[float] = field(default_factory=list)
    """Each step's start on this rank (perf_counter seconds at the barrier exit)."""
    step_events: list[list[ActionSpan]] = field(default_factory=list)
    """Each step's actions, timed from the step's start."""
    step_cpu: list[list[ActionSpan]] = field(default_factory=list)
    """The same actions from 0 to the CPU ms of this rank's thread."""
    allreduce_ms: list[float] = field(default_factory=list)
    """Each step's gradient synchronisation on this rank, ms."""
    memory: RankMemory | None = None
    """The memory step's measurement (tracked breakdown, allocator peak, RSS window); None until that step ran."""
    diverged_step: int | None = None
    """The step whose loss was not finite (the run stopped after it), or None."""

    def add_step(self, step_ms: float, t0: float, events: list[Any]) -> None:
        """Log a finished step: its agreed time, its start, and the recorder's events of it."""
        self.step_ms.append(step_ms)
        self.step_t0.append(t0)
        self.step_events.append([ActionSpan(e.stage, e.kind, e.microbatch, (e.start - t0) * 1e3, (e.end - t0) * 1e3)
                                 for e in events])
        self.step_cpu.append([ActionSpan(e.stage, e.kind, e.microbatch, 0.0, e.cpu_ms) for e in events])


def action_medians(steps: list[list[ActionSpan]]) -> dict[str, float]:
    """'<stage><kind>' -> median duration in ms over measured steps and micro-batches.

    B and I include their recompute (R) so they compare with the cost model's B/I.
    """
    per: dict[str, list[float]] = {}
    for events in steps:
        rec: dict[tuple[int, int], float] = {}
        for e in events:
            if e.kind == "R":
                rec[(e.stage, e.microbatch)] = e.ms
        for e in events:
            if e.kind in ("F", "B", "I", "W", "O"):
                extra = rec.get((e.stage, e.microbatch), 0.0) if e.kind in ("B", "I") else 0.0
                per.setdefault(f"{e.stage}{e.kind}", []).append(e.ms + extra)
    return {k: statistics.median(v) for k, v in sorted(per.items())}


def _measured_steps(step_ms: list[float], warmup: int, memory_index: int) -> list[int]:
    """Indices into step_ms after the warm-up, without the memory step (its hooks and counting
    slow it) unless it is the only one.

    RunOptions refuses warmup >= steps, and a resumed run with no step left after its warm-up
    (RunOptions.check_resume, from planner.execute.preflight); the `min` only guards library
    callers that train fewer steps than they warm up."""
    measured = list(range(min(warmup, len(step_ms) - 1), len(step_ms))) if step_ms else []
    if len(measured) > 1 and memory_index in measured:
        measured.remove(memory_index)
    return measured


def rank_measurement(plan: Plan, pipe: Any, rank: int, log: StepLog, *, start_step: int, loss_log: dict[int, float],
                     comm: list[CommMeasurement], boundary: dict[int, list[int]], warmup: int,
                     mem_step: int = -1) -> RankMeasurement:
    """What this rank measured, for rank 0 to gather (planner.execute.results reads it)."""
    step_ms = log.step_ms
    measured = _measured_steps(step_ms, warmup, mem_step - start_step)
    # The step whose time is the median of the measured ones stands for the run in the timeline.
    chosen = min(measured, key=lambda i: abs(step_ms[i] - statistics.median(step_ms[j] for j in measured))) if measured else -1
    reports_loss = pipe.is_last and pipe.dp_index == 0 and pipe.tp_index == 0
    return RankMeasurement(
        rank=rank,
        device=rank_device(plan, pipe.pp_index),
        replica=pipe.dp_index,
        tp=pipe.tp_index,
        grad_allreduce_ms=tuple(log.allreduce_ms[i] for i in measured if i < len(log.allreduce_ms)) if pipe.dp > 1 else (),
        host=socket.gethostname(),
        stages=tuple(m.stage for m in pipe.modules),
        runtime=pipe.runtime,
        first_step=start_step,
        step_ms=tuple(step_ms),
        measured_steps=tuple(measured),
        timeline_step=chosen,
        timeline_t0=log.step_t0[chosen] if chosen >= 0 else 0.0,
        events=tuple(log.step_events[chosen]) if chosen >= 0 else (),
        action_ms=action_medians([log.step_events[i] for i in measured]),
        action_cpu_ms=action_medians([log.step_cpu[i] for i in measured]),
        losses={k: v for k, v in sorted(loss_log.items()) if k >= start_step} if reports_loss else {},
        diverged_step=log.diverged_step,
        memory=log.memory,
        comm=tuple(comm),
        boundary_bytes={s: (v[0], v[1]) for s, v in boundary.items()},
        threads=torch.get_num_threads(),
    )
