"""Activation memory of a schedule: exact, from each rank's own order of actions.

A micro-batch's activations on a stage are allocated when its F starts and freed when its
backward ends: the end of B, or of W for a split backward (the weight gradient still needs the
layer inputs). While a B or I of a stage with recomputed layers runs, one micro-batch of
recomputed activations is alive on top (`transient_bytes`). Parameter gradients exist from the
end of a stage's first weight-gradient action (B, or W when split) to the optimizer step, which
frees them (torch's `zero_grad(set_to_none=True)`): `memory_peaks` counts them only from
there, so a schedule whose activations peak before any backward (GPipe) does not hold both.
A split backward's I leaves behind what its W starts from (the gradients at the nodes where the
weights' paths meet the input's, planner.cost.memory's `wgrad`): a micro-batch holds them from
the end of its I to the end of its W (`Moment.pending_w`); and what it sent stays alive until the
step ends, torch's runtime for split backwards waiting for its sends only then: each I's input
gradient, and each output beyond what the stage's own backward frees (`Moment.sent_grads`, I
actions ended; measured on a 2-rank zb GPT: both ranks held 0.5 MiB more per 4 more micro-batches).
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
# micro-batches held, the stage whose backward runs, gradients exist, stage outputs held,
# micro-batches whose I ended and W did not, input gradients sent and held (each per stage of the rank)
_State = tuple[tuple[int, ...], int, tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]]


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
            zeros = (0,) * len(stages)
            out.append((stages, [(zeros, -1, zeros, zeros, zeros, zeros)]))
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
        # pending W: I ended before this action and W did not (during its W a micro-batch still holds them)
        i_end, w_end = np.zeros_like(alloc), np.zeros_like(alloc)
        is_i, is_w = kind == CODE_I, kind == CODE_W
        i_end[rows[is_i], col[is_i]] = 1
        w_end[rows[is_w], col[is_w]] = 1
        sent = np.cumsum(i_end, axis=0) - i_end  # each ended I's input gradient, held until the step ends
        pending = sent - (np.cumsum(w_end, axis=0) - w_end)
        n = len(stages)
        uniq = np.unique(np.column_stack([during, bwd_stage, grads, outputs, pending, sent]), axis=0).tolist()
        out.append((stages, [(tuple(u[:n]), u[n], tuple(u[n + 1:2 * n + 1]), tuple(u[2 * n + 1:3 * n + 1]),
                              tuple(u[3 * n + 1:4 * n + 1]), tuple(u[4 * n + 1:])) for u in uniq]))
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
    pending_w: int = 0
    """Micro-batches whose I has ended and whose W has not (split backward only): each holds what
    its W starts from (planner.cost.memory's wgrad bytes)."""
    sent_grads: int = 0
    """I actions of the stage ended so far in the step (split backward only): torch's runtime holds
    each one's input gradient until the step ends, and the output of each whose W ended too
    (sent_grads - pending_w; planner.cost.memory.sent_bytes)."""


def stage_memory_moments(schedule: PipelineSchedule) -> list[tuple[Moment, ...]]:
    """Per stage, the moments at which its memory can peak, from each rank's order (the states
    memory_peaks walks): each distinct (micro-batches held, backward running or not, gradients or
    not, pending W, ended I), less the moments another one covers (as many or more micro-batches,
    pending W, ended I and ended W, and the transient or the gradients wherever it has them: held
    bytes are never negative). Without a split backward the last two are always 0:
    the most micro-batches held for each of (backward running or not) x (gradients or not).

    GPipe and 1F1B have two: the stage's first backward (all it holds, no gradients yet) and a
    later backward (gradients). Priced with planner.cost.stage_bytes, where a rank runs one stage
    this is the simulator's peak, except that a split backward frees the stage output torch holds
    at I, not W (the partitioner charges it until W: at least the simulator's peak)."""
    seen: list[set[Moment]] = [set() for _ in range(schedule.n_stages)]
    for stages, states in _states(schedule):
        for i, s in enumerate(stages):
            for counts, bwd, has_grad, _, pending, sent in states:
                seen[s].add(Moment(counts[i], bwd == s, bool(has_grad[i]), pending[i], sent[i]))
    out = []
    for moments in seen:
        kept = [m for m in moments if not any(o != m and o.in_flight >= m.in_flight and o.transient >= m.transient
                                              and o.gradients >= m.gradients and o.pending_w >= m.pending_w
                                              and o.sent_grads >= m.sent_grads
                                              and o.sent_grads - o.pending_w >= m.sent_grads - m.pending_w
                                              for o in moments)]
        out.append(tuple(sorted(kept, key=lambda m: (m.gradients, m.transient, m.in_flight, m.pending_w, m.sent_grads))))
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
        for counts, bwd, _, _, _, _ in states:
            value = sum(c * k for c, k in zip(counts, kept))
            if bwd >= 0:
                value += float(transient_bytes[bwd])
            if value > best:
                best = value
        peaks.append(best)
    return peaks


def memory_peaks(schedule: PipelineSchedule, kept_bytes: Sequence[float], transient_bytes: Sequence[float],
                 gradient_bytes: Sequence[float], output_bytes: Sequence[float] | None = None,
                 wgrad_bytes: Sequence[float] | None = None,
                 sent_bytes: Sequence[tuple[float, float, float]] | None = None,
                 ) -> list[tuple[float, float]]:
    """rank -> (activation bytes, gradient bytes) at the moment their sum peaks.

    As activation_peaks, with each stage's gradients (`gradient_bytes[s]`) counted only after its
    first weight-gradient action (module docstring), and the part `output_bytes[s]` of its kept
    bytes (the stage output torch holds, planner.cost.held_output) freed at the end of I when the
    backward is split, not of W; and `wgrad_bytes[s]` (planner.cost.memory's wgrad) per micro-batch
    whose I ended and W did not, and what its sends hold until the step ends (`sent_bytes[s]`,
    planner.cost.memory.sent_bytes: per ended I its input gradient, per ended W its output, per
    pending W the held output; held
    until the step ends). Without those two the activation part is at most activation_peaks'
    value, and the sum at most that plus all the rank's gradients.
    """
    if len(gradient_bytes) != schedule.n_stages:
        raise ScheduleError(f"memory of schedule {schedule.name!r}: need {schedule.n_stages} gradient values, got {len(gradient_bytes)}")
    for name, values in (("wgrad", wgrad_bytes), ("sent", sent_bytes)):
        if values is not None and len(values) != schedule.n_stages:
            raise ScheduleError(f"memory of schedule {schedule.name!r}: need {schedule.n_stages} {name} values, got {len(values)}")
    activation_peaks(schedule, kept_bytes, transient_bytes)  # checks the other lengths
    out = []
    for stages, states in _states(schedule):
        held = [float(output_bytes[s]) if output_bytes is not None else 0.0 for s in stages]
        kept = [float(kept_bytes[s]) - h for s, h in zip(stages, held)]
        grad = [float(gradient_bytes[s]) for s in stages]
        wgrad = [float(wgrad_bytes[s]) if wgrad_bytes is not None else 0.0 for s in stages]
        sends = [tuple(float(x) for x in sent_bytes[s]) if sent_bytes is not None else (0.0, 0.0, 0.0) for s in stages]
        best, at = -1.0, (0.0, 0.0)
        for counts, bwd, has_grad, outs, pending, sent in states:
            act = (sum(c * k for c, k in zip(counts, kept)) + sum(c * h for c, h in zip(outs, held))
                   + sum(c * w for c, w in zip(pending, wgrad))
                   + sum(i * x[0] + (i - p) * x[1] + p * x[2] for i, p, x in zip(sent, pending, sends))
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
