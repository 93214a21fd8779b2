"""Activation memory of a schedule: exact, from each rank's own order of actions.

A micro-batch's activations on a stage are allocated when its F starts and freed when its
backward ends: the end of B, or of W for a split backward (the weight gradient still needs the
layer inputs). While a B or I of a stage with recomputed layers runs, one micro-batch of
recomputed activations is alive on top (`transient_bytes`). Parameter gradients exist from the
end of a stage's first weight-gradient action (B, or W when split) to the optimizer step, which
frees them (torch's `zero_grad(set_to_none=True)`): `memory_peaks` counts them only from
there, so a schedule whose activations peak before any backward (GPipe) does not hold both.
Nothing here depends on timing:
a rank runs its actions one after another, so the sequence of allocations and frees on it is its
order, and the simulator's memory timeline reaches exactly these peaks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from planner.errors import ScheduleError
from planner.schedules.actions import PipelineSchedule
from planner.schedules.compiled import CODE_B, CODE_F, CODE_I, CODE_W, CompiledSchedule, compile_schedule

__all__ = ["Moment", "stage_memory_moments", "stage_inflight_peak", "rank_activation_peak", "activation_peaks", "memory_peaks"]

_ATTR = "_pplan_inflight"
# micro-batches held, the stage whose backward runs, gradients exist, stage outputs held
_State = tuple[tuple[int, ...], int, tuple[int, ...], tuple[int, ...]]


def _states(schedule: PipelineSchedule) -> list[tuple[tuple[int, ...], list[_State]]]:
    cache = schedule.__dict__.get(_ATTR)
    if cache is None:
        cache = _inflight_states(compile_schedule(schedule))
        object.__setattr__(schedule, _ATTR, cache)  # immutable schedule: safe private cache
    return cache


def _inflight_states(cs: CompiledSchedule) -> list[tuple[tuple[int, ...], list[_State]]]:
    S, M = cs.n_stages, cs.n_microbatches
    out = []
    for r in range(cs.n_ranks):
        stages = cs.rank_stages[r]
        ids = np.asarray(cs.ids[r], dtype=np.int64)
        if ids.size == 0:
            out.append((stages, [((0,) * len(stages), -1, (0,) * len(stages), (0,) * len(stages))]))
            continue
        local = np.full(S, -1, dtype=np.int64)
        local[list(stages)] = np.arange(len(stages))
        key = ids // M
        kind, stage = key // S, key % S
        col = local[stage]
        # +1 when F starts (before the action), -1 when the last backward action ends (after it)
        alloc = np.zeros((ids.size, len(stages)), dtype=np.int64)
        free = np.zeros_like(alloc)
        rows = np.arange(ids.size)
        is_f = kind == CODE_F
        alloc[rows[is_f], col[is_f]] = 1
        # activations are freed by the last backward action of the micro-batch: B, or W when split
        last = ((kind == CODE_B) | (kind == CODE_W)) if cs.split_backward else kind == CODE_B
        free[rows[last], col[last]] = 1
        during = np.cumsum(alloc, axis=0) - np.cumsum(free, axis=0) + free
        bwd_stage = np.where((kind == CODE_B) | (kind == CODE_I), stage, -1)  # when the transient lives
        # gradients exist once an earlier action of the stage computed weight gradients
        grads = ((np.cumsum(free, axis=0) - free) > 0).astype(np.int64)
        # the stage output torch holds for the backward goes at the end of B, or of I when split
        early = np.zeros_like(alloc)
        first_bwd = (kind == CODE_B) | (kind == CODE_I)
        early[rows[first_bwd], col[first_bwd]] = 1
        outputs = np.cumsum(alloc, axis=0) - np.cumsum(early, axis=0) + early
        n = len(stages)
        uniq = np.unique(np.column_stack([during, bwd_stage, grads, outputs]), axis=0).tolist()
        out.append((stages, [(tuple(u[:n]), u[n], tuple(u[n + 1:2 * n + 1]), tuple(u[2 * n + 1:])) for u in uniq]))
    return out


def stage_inflight_peak(schedule: PipelineSchedule) -> list[int]:
    """Per stage: the most micro-batches whose activations it holds at once."""
    peak = [0] * schedule.n_stages
    for stages, states in _states(schedule):
        for i, s in enumerate(stages):
            peak[s] = max(state[0][i] for state in states)
    return peak


@dataclass(frozen=True)
class Moment:
    """A kind of moment in a stage's schedule at which its memory can peak (planner.cost.stage_bytes)."""

    in_flight: int
    """The most micro-batches whose activations the stage holds at such a moment."""
    transient: bool
    """Whether a backward action (B or I) of the stage runs then: a recomputed layer's activations
    and the largest layer workspace are alive on top."""
    gradients: bool
    """Whether the stage's parameter gradients exist then (after its first weight-gradient action)."""


def stage_memory_moments(schedule: PipelineSchedule) -> list[tuple[Moment, ...]]:
    """Per stage, the moments at which its memory can peak, from each rank's order (the states
    memory_peaks walks): for each of (backward running or not) x (gradients or not), the most
    micro-batches held, less the moments another one covers (as many or more micro-batches, and
    the transient or the gradients wherever it has them: held bytes are never negative).

    GPipe and 1F1B have two: the stage's first backward (all it holds, no gradients yet) and a
    later backward (gradients). Priced with planner.cost.stage_bytes, where a rank runs one stage
    this is the simulator's peak, except that a split backward frees the stage output torch holds
    at I, not W (the partitioner charges it until W: at least the simulator's peak)."""
    best: list[dict[tuple[bool, bool], int]] = [{} for _ in range(schedule.n_stages)]
    for stages, states in _states(schedule):
        for i, s in enumerate(stages):
            for counts, bwd, has_grad, _ in states:
                key = (bwd == s, bool(has_grad[i]))
                best[s][key] = max(best[s].get(key, 0), counts[i])
    out = []
    for kinds in best:
        moments = [Moment(c, t, g) for (t, g), c in sorted(kinds.items())]
        kept = [m for m in moments if not any(o != m and o.in_flight >= m.in_flight and o.transient >= m.transient
                                              and o.gradients >= m.gradients for o in moments)]
        out.append(tuple(sorted(set(kept), key=lambda m: (m.gradients, m.transient, m.in_flight))))
    return out


def activation_peaks(schedule: PipelineSchedule, kept_bytes: Sequence[float],
                     transient_bytes: Sequence[float]) -> list[float]:
    """rank -> peak activation bytes (see rank_activation_peak), all ranks at once."""
    if len(kept_bytes) != schedule.n_stages or len(transient_bytes) != schedule.n_stages:
        raise ScheduleError(f"memory of schedule {schedule.name!r}: need {schedule.n_stages} kept/transient values, got {len(kept_bytes)} and {len(transient_bytes)}")
    peaks = []
    for stages, states in _states(schedule):
        kept = [float(kept_bytes[s]) for s in stages]
        best = 0.0
        for counts, bwd, _, _ in states:
            value = sum(c * k for c, k in zip(counts, kept))
            if bwd >= 0:
                value += float(transient_bytes[bwd])
            if value > best:
                best = value
        peaks.append(best)
    return peaks


def memory_peaks(schedule: PipelineSchedule, kept_bytes: Sequence[float], transient_bytes: Sequence[float],
                 gradient_bytes: Sequence[float], output_bytes: Sequence[float] | None = None) -> list[tuple[float, float]]:
    """rank -> (activation bytes, gradient bytes) at the moment their sum peaks.

    As activation_peaks, with each stage's gradients (`gradient_bytes[s]`) counted only after its
    first weight-gradient action (module docstring), and the part `output_bytes[s]` of its kept
    bytes (the stage output torch holds, planner.cost.held_output) freed at the end of I when the
    backward is split, not of W. The activation part is at most activation_peaks' value, and the
    sum at most that plus all the rank's gradients.
    """
    if len(gradient_bytes) != schedule.n_stages:
        raise ScheduleError(f"memory of schedule {schedule.name!r}: need {schedule.n_stages} gradient values, got {len(gradient_bytes)}")
    activation_peaks(schedule, kept_bytes, transient_bytes)  # checks the other lengths
    out = []
    for stages, states in _states(schedule):
        held = [float(output_bytes[s]) if output_bytes is not None else 0.0 for s in stages]
        kept = [float(kept_bytes[s]) - h for s, h in zip(stages, held)]
        grad = [float(gradient_bytes[s]) for s in stages]
        best, at = -1.0, (0.0, 0.0)
        for counts, bwd, has_grad, outs in states:
            act = (sum(c * k for c, k in zip(counts, kept)) + sum(c * h for c, h in zip(outs, held))
                   + (float(transient_bytes[bwd]) if bwd >= 0 else 0.0))
            g = sum(h * x for h, x in zip(has_grad, grad))
            if act + g > best:
                best, at = act + g, (act, g)
        out.append(at)
    return out


def rank_activation_peak(schedule: PipelineSchedule, rank: int, kept_bytes: Sequence[float],
                         transient_bytes: Sequence[float]) -> float:
    """Peak activation bytes on `rank`: max over its order of sum(in-flight x kept) + transient.

    `kept_bytes[s]` / `transient_bytes[s]` are per global stage (StageCost.kept_bytes and
    .transient_bytes); the transient counts only while a B or I of that stage runs.
    """
    if not 0 <= rank < schedule.n_ranks:
        raise ScheduleError(f"rank {rank} is outside 0..{schedule.n_ranks - 1}")
    return activation_peaks(schedule, kept_bytes, transient_bytes)[rank]
