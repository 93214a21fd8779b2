"""Activation memory of a schedule: exact, from each rank's own order of actions.

A micro-batch's activations on a stage are allocated when its F starts and freed when its
backward ends: the end of B, or of W for a split backward (the weight gradient still needs the
layer inputs). While a B or I of a stage with recomputed layers runs, one micro-batch of
recomputed activations is alive on top (`transient_bytes`). Parameter gradients exist from the
end of a stage's first weight-gradient action (B, or W when split) to the optimizer step, which
frees them (torch's `zero_grad(set_to_none=True)`): `memory_peaks` counts them only from
there, so a schedule whose activations peak before any backward (GPipe) does not hold both.
A split W (on any stage but the first, whose W is a whole backward) holds them while it runs:
torch's stage_backward_weight makes every weight gradient before the graph that holds its
micro-batch's activations goes (measured per action on a 4-rank zb synthetic pipeline: each of
ranks 1-3 peaked during its first W at all four micro-batches' activations plus the stage's
gradients, 61.1 MiB, where a B frees its saved tensors layer by layer as it makes them).
A split backward's I leaves behind what its W starts from (the gradients at the nodes where the
weights' paths meet the input's, planner.cost.memory's `wgrad`): a micro-batch holds them from
the end of its I to the end of its W (`Moment.pending_w`); while the I runs it stores them layer by
layer (torch's hooks), what `Moment.running_i` prices (planner.cost.held.running_i_extra). The first stage's I computes no input gradient (its input needs
none): its whole backward, and so its transient, runs at W.
Where torch's runtime waits for its sends only when the step ends (registry `holds_sends`: the
_PipelineScheduleRuntime behind zb and interleaved), what a stage sent stays alive until then:
each I's or B's input gradient, and each output beyond what the stage's own backward frees
(`Moment.sent_grads`: I actions ended, or B actions, each an ended I and W at once), also after
the rank's last action (a state of its own). Measured on a 2-rank zb GPT: both ranks held
0.5 MiB more per 4 more micro-batches; interleaved plans left them out until measured 2.7-12% under.
torch's Schedule1F1B holds one send that way (registry `holds_warmup_send`): the last forward its
warm-up fired keeps its micro-batch's output alive after that micro-batch's backward, until the
first backward after the stage's last forward ends (`Moment.warmup_send`).
Nothing here depends on timing:
a rank runs its actions one after another, so the sequence of allocations and frees on it is its
order, and the simulator's memory timeline reaches exactly these peaks. The distinct states of
every rank are built once per schedule and priced in arrays by planner.schedules.memory_states.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from planner.errors import ScheduleError
from planner.schedules.actions import PipelineSchedule
from planner.schedules.memory_states import activation_peaks_table, memory_peaks_table, pareto_front, state_table

__all__ = ["Moment", "MomentStack", "with_more_microbatches", "stack_moments", "corner_moments", "stage_memory_moments", "undominated",
           "stage_inflight_peak", "rank_activation_peak", "activation_peaks", "memory_peaks"]

# Results that depend only on the schedule, cached on the (immutable) schedule object: the
# partitioner asks for them at every grid point and polish, with the same schedule.
_MOMENTS_ATTR = "_pplan_moments"
_INFLIGHT_ATTR = "_pplan_inflight_peak"


def stage_inflight_peak(schedule: PipelineSchedule) -> list[int]:
    """Per stage: the most micro-batches whose activations it holds at once."""
    cached = schedule.__dict__.get(_INFLIGHT_ATTR)
    if cached is None:
        t = state_table(schedule)
        most = np.maximum.reduceat(t.during, t.starts[:-1], axis=0)  # (ranks, width)
        peak = [0] * schedule.n_stages
        for r, stages in enumerate(t.rank_stages):
            for i, s in enumerate(stages):
                peak[s] = int(most[r, i])
        cached = tuple(peak)
        object.__setattr__(schedule, _INFLIGHT_ATTR, cached)
    return list(cached)


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
    its W starts from (planner.cost.held's wgrad bytes), and of its output what
    planner.cost.held.pending_output says (none on the last stage)."""
    sent_grads: int = 0
    """I actions of the stage ended so far in the step, and B actions where the runtime holds its
    sends (registry holds_sends; 0 elsewhere): torch's runtime holds each one's input gradient until
    the step ends, and the output of each whose W ended too (sent_grads - pending_w: a B is an ended
    I and W at once; planner.cost.held.sent_bytes)."""
    running_i: bool = False
    """Whether an I of the stage runs then (split backward only): it stores its micro-batch's wgrads
    as its backward goes (torch's hooks), priced beyond the transient by planner.cost.held.running_i_extra."""
    running_w: bool = False
    """Whether a W of the stage runs then, on a stage but the first, after the stage's first W of the
    step (split backward only): it holds fresh weight gradients of two parameter groups beyond the
    stage's gradients (planner.cost.w_workspace)."""
    warmup_send: bool = False
    """Whether the send of the warm-up's last fired forward still holds its micro-batch's output then,
    after that micro-batch's backward (registry holds_warmup_send: 1F1B): one output of the stage more."""


@dataclass(frozen=True)
class MomentStack:
    """A stage's moments as columns, one row per moment (arrays of shape (n, 1)), for
    planner.cost.moment_bytes to price them all at once against arrays of stages: a held-sends
    schedule has about 2P per stage (P ranks), too many to price one call each."""

    in_flight: np.ndarray
    """Moment.in_flight of each row."""
    transient: np.ndarray
    """Moment.transient of each row (bool)."""
    gradients: np.ndarray
    """Moment.gradients of each row (bool)."""
    pending_w: np.ndarray
    """Moment.pending_w of each row."""
    sent_grads: np.ndarray
    """Moment.sent_grads of each row."""
    running_i: np.ndarray
    """Moment.running_i of each row (bool)."""
    running_w: np.ndarray
    """Moment.running_w of each row (bool)."""
    warmup_send: np.ndarray
    """Moment.warmup_send of each row (bool)."""


def with_more_microbatches(moment: Moment, extra: int, every_microbatch_held: bool) -> Moment:
    """`moment` of a schedule run with `extra` more micro-batches of the same shape (the cluster
    search derives moments at a shorter M', planner.partition.parallel_eval.memory_moments): they
    add to the sends held once any is, and to the micro-batches in flight where the schedule holds
    every one (GPipe: registry holds_every_microbatch)."""
    return replace(moment, in_flight=moment.in_flight + extra if every_microbatch_held else moment.in_flight,
                   sent_grads=moment.sent_grads + extra if moment.sent_grads else 0)


def stack_moments(moments: Sequence[Moment]) -> MomentStack:
    """`moments` as one MomentStack, in their order."""
    def column(name: str, dtype: type) -> np.ndarray:
        return np.array([getattr(m, name) for m in moments], dtype=dtype).reshape(-1, 1)
    in_flight = column("in_flight", float if any(isinstance(m.in_flight, float) for m in moments) else np.int64)
    return MomentStack(in_flight, column("transient", bool), column("gradients", bool), column("pending_w", np.int64),
                       column("sent_grads", np.int64), column("running_i", bool), column("running_w", bool),
                       column("warmup_send", bool))


@functools.lru_cache(maxsize=8192)
def corner_moments(moments: tuple[Moment, ...]) -> tuple[Moment, ...]:
    """`moments` less each that lies between two others with its flags (transient, gradients,
    running_i, running_w, warmup_send) on a line of their counts (in_flight, pending_w, sent_grads): a held-sends schedule's
    drain trades one micro-batch in flight for one more send held, about P moments on a line. Without a
    recompute saving (planner.cost.moment_bytes is affine in the counts) such a moment's bytes are
    a weighted mean of its two ends', never the peak alone, so a solver that prices no recompute
    choice checks the corners only (3 to 6 where a held-sends stage has 17 at P = 8, 33 at P = 16)."""
    if not all(float(m.in_flight).is_integer() for m in moments):  # a hand-made count: no lattice to reason on
        return moments
    flags = np.array([[m.transient, m.gradients, m.running_i, m.running_w, m.warmup_send] for m in moments],
                     dtype=bool).reshape(-1, 5)
    counts = np.array([[m.in_flight, m.pending_w, m.sent_grads] for m in moments], dtype=np.int64).reshape(-1, 3)
    between = np.zeros(len(moments), dtype=bool)
    for f in np.unique(flags, axis=0):
        group = np.flatnonzero((flags == f).all(axis=1))
        if group.size < 3:
            continue
        d = counts[group][None, :, :] - counts[group][:, None, :]  # d[i, o]: from moment i to moment o
        # i lies between two others when some direction from it and its opposite both occur: each
        # direction reduced by its gcd, exact on integer counts, as one integer key per (i, direction)
        g = np.gcd.reduce(d, axis=-1)
        u = d // np.maximum(g, 1)[..., None]
        base = 2 * int(np.abs(u).max()) + 1
        row = np.arange(group.size)[:, None] * base ** 3
        key = row + _direction_key(u, base)
        opposite = row + _direction_key(-u, base)
        same = (d == 0).all(axis=-1)  # i itself, or a moment equal in counts: not a direction
        between[group] = (np.isin(opposite, key[~same]) & ~same).any(axis=1)
    return tuple(m for m, inner in zip(moments, between) if not inner)


def _direction_key(u: np.ndarray, base: int) -> np.ndarray:
    """One integer per direction u (last axis of 3 counts, each within +-(base - 1) / 2)."""
    half = base // 2
    return ((u[..., 0] + half) * base + (u[..., 1] + half)) * base + (u[..., 2] + half)


def stage_memory_moments(schedule: PipelineSchedule) -> list[tuple[Moment, ...]]:
    """Per stage, the moments at which its memory can peak, from each rank's order (the states
    memory_peaks walks): each distinct (micro-batches held, backward running or not, gradients or
    not, pending W, ended I, I running or not, W running or not, warm-up send held or not), less
    the moments another one covers (as many or more micro-batches,
    pending W, ended I and ended W, and the transient or the gradients wherever it has them: held
    bytes are never negative; and as many or more outputs held, in_flight - pending_w). Without a
    split backward pending W and I running are always 0, and ended I too where the runtime does not
    hold its sends (GPipe, 1F1B): the most micro-batches held for each of (backward running or not)
    x (gradients or not), and for 1F1B (warm-up send held or not).

    GPipe has two: the stage's first backward (all it holds, no gradients yet) and a later backward
    (gradients); 1F1B a third on a stage with two or more warm-up forwards, a later backward while
    the warm-up's send holds an output. Priced with planner.cost.stage_bytes, where a rank runs one stage
    this is the simulator's peak (a pending W's held output included: in_flight - pending_w is the
    memory_peaks table's count of outputs held, and both price the rest with sent_bytes)."""
    cached = schedule.__dict__.get(_MOMENTS_ATTR)
    if cached is None:
        cached = tuple(_moments(schedule))
        object.__setattr__(schedule, _MOMENTS_ATTR, cached)
    return list(cached)


def _moments(schedule: PipelineSchedule) -> list[tuple[Moment, ...]]:
    t = state_table(schedule)
    out: list[tuple[Moment, ...]] = [()] * schedule.n_stages
    for r, stages in enumerate(t.rank_stages):
        lo, hi = t.starts[r], t.starts[r + 1]
        for i, s in enumerate(stages):
            out[s] = _undominated(np.column_stack([t.during[lo:hi, i], t.bwd[lo:hi] == s, t.grads[lo:hi, i], t.pending[lo:hi, i],
                                                   t.sent[lo:hi, i], t.running[lo:hi, i], t.wrun[lo:hi, i], t.warm[lo:hi, i]]))
    return out


def undominated(moments: Sequence[Moment]) -> tuple[Moment, ...]:
    """`moments` less those another one covers, in stage_memory_moments' order."""
    return _undominated(np.array([[m.in_flight, m.transient, m.gradients, m.pending_w, m.sent_grads, m.running_i, m.running_w,
                                   m.warmup_send] for m in moments], dtype=np.int64).reshape(-1, 8))


def _undominated(rows: np.ndarray) -> tuple[Moment, ...]:
    """The moments of `rows` (in_flight, transient, gradients, pending_w, sent_grads, running_i, running_w,
    warmup_send) that no other covers, sorted."""
    # covered: another has as many or more of each, of ended W (sent - pending) and of held
    # outputs (during - pending: a pending W's output is priced apart, planner.cost.moment_bytes).
    # Two exact cuts first, cheap where pareto_front is not (a held-sends stage has hundreds of
    # states): of rows alike but for in_flight the most covers the rest, and of rows alike but for
    # sent_grads too (more ended I, and as many more ended W)
    seen = _most_of(_most_of(rows.astype(np.int64), 0), 4)
    kept = seen[pareto_front(np.column_stack([seen, seen[:, 4] - seen[:, 3], seen[:, 0] - seen[:, 3]]))].tolist()
    moments = [Moment(c, bool(bwd), bool(g), p, x, bool(i), bool(w), bool(h)) for c, bwd, g, p, x, i, w, h in kept]
    return tuple(sorted(moments, key=lambda m: (m.gradients, m.transient, m.in_flight, m.pending_w, m.sent_grads, m.running_i,
                                                m.running_w, m.warmup_send)))


def _most_of(rows: np.ndarray, col: int) -> np.ndarray:
    """`rows` with one row per distinct rest of its columns: the one with the most in column `col`."""
    if len(rows) < 2:
        return rows
    rest = [c for c in range(rows.shape[1]) if c != col]
    ordered = rows[np.lexsort([rows[:, col]] + [rows[:, c] for c in reversed(rest)])]
    last = np.r_[(np.diff(ordered[:, rest], axis=0) != 0).any(axis=1), True]
    return ordered[last]


def _per_stage(schedule: PipelineSchedule, name: str, values: Sequence[float] | None, width: int = 0) -> np.ndarray:
    """`values` as a float array of one entry (or `width` entries) per stage; zeros when None."""
    S = schedule.n_stages
    if values is None:
        return np.zeros((S, width) if width else S)
    if len(values) != S:
        raise ScheduleError(f"memory of schedule {schedule.name!r}: need {S} {name} values, got {len(values)}")
    return np.asarray(values, dtype=float).reshape((S, width) if width else S)


def _check_kept(schedule: PipelineSchedule, kept_bytes: Sequence[float], transient_bytes: Sequence[float]) -> None:
    if len(kept_bytes) != schedule.n_stages or len(transient_bytes) != schedule.n_stages:
        raise ScheduleError(f"memory of schedule {schedule.name!r}: need {schedule.n_stages} kept/transient values, got {len(kept_bytes)} and {len(transient_bytes)}")


def activation_peaks(schedule: PipelineSchedule, kept_bytes: Sequence[float],
                     transient_bytes: Sequence[float]) -> list[float]:
    """rank -> peak activation bytes (see rank_activation_peak), all ranks at once: over the
    rank's states, the largest sum(in flight x kept) + the transient of the stage whose backward
    runs, and at least 0."""
    _check_kept(schedule, kept_bytes, transient_bytes)
    return activation_peaks_table(state_table(schedule), np.asarray(kept_bytes, dtype=float),
                                  np.asarray(transient_bytes, dtype=float))


def memory_peaks(schedule: PipelineSchedule, kept_bytes: Sequence[float], transient_bytes: Sequence[float],
                 gradient_bytes: Sequence[float], output_bytes: Sequence[float] | None = None,
                 wgrad_bytes: Sequence[float] | None = None,
                 sent_bytes: Sequence[tuple[float, float, float]] | None = None,
                 running_bytes: Sequence[float] | None = None,
                 w_workspace_bytes: Sequence[float] | None = None,
                 sent_output_bytes: Sequence[float] | None = None,
                 ) -> list[tuple[float, float]]:
    """rank -> (activation bytes, gradient bytes) at the moment their sum peaks.

    As activation_peaks, with each stage's gradients (`gradient_bytes[s]`) counted only after its
    first weight-gradient action (module docstring), and the part `output_bytes[s]` of its kept
    bytes (the stage output torch holds, planner.cost.held_output) freed at the end of I when the
    backward is split, not of W; and `wgrad_bytes[s]` (planner.cost.held's wgrad) per micro-batch
    whose I ended and W did not, `running_bytes[s]` (planner.cost.held.running_i_extra) while an I
    of the stage runs, `w_workspace_bytes[s]` (planner.cost.w_workspace) while a split W of a stage but
    the first runs, and `sent_bytes[s]` (planner.cost.held.sent_bytes: per
    ended I its input gradient and per ended W its output, held by the sends until the step ends
    where the runtime holds them, an ended B counting as both, and per pending W what it still holds
    of its output, planner.cost.held.pending_output: the held output on every stage but the last),
    and `sent_output_bytes[s]` (the stage's output, StageCost.output_bytes) while 1F1B's warm-up send
    holds one after its backward (registry holds_warmup_send).
    Without those two the activation part is at most activation_peaks' value, and the sum at most
    that plus all the rank's gradients.

    The definition, state by state over the rank's states in their order (memory_states' table):
    with kept = kept_bytes - output_bytes per stage, act = sum(in flight x kept) + sum(outputs held
    x output_bytes) + sum(pending W x wgrad + I running x running + W running x w_workspace) + sum(ended I x sent[0] + ended W x sent[1] + pending
    W x sent[2]) + sum(warm-up send held x sent_output_bytes) + the transient of the stage whose backward runs, g = sum(gradients exist x
    gradient_bytes), each sum stage by stage; the first state with the largest act + g gives the
    pair. memory_states evaluates exactly this, in arrays.
    """
    grad = _per_stage(schedule, "gradient", gradient_bytes)
    wgrad = _per_stage(schedule, "wgrad", wgrad_bytes)
    running = _per_stage(schedule, "running", running_bytes)
    w_work = _per_stage(schedule, "w_workspace", w_workspace_bytes)
    warm = _per_stage(schedule, "sent output", sent_output_bytes)
    sends = _per_stage(schedule, "sent", sent_bytes, 3)
    _check_kept(schedule, kept_bytes, transient_bytes)
    held = _per_stage(schedule, "output", output_bytes)
    prices = {"kept": np.asarray(kept_bytes, dtype=float) - held, "held": held, "wgrad": wgrad, "running": running, "w_work": w_work,
              "sent_grad": sends[:, 0], "sent_output": sends[:, 1], "sent_held": sends[:, 2], "warm": warm, "grad": grad}
    return memory_peaks_table(state_table(schedule), prices, np.asarray(transient_bytes, dtype=float))


def rank_activation_peak(schedule: PipelineSchedule, rank: int, kept_bytes: Sequence[float],
                         transient_bytes: Sequence[float]) -> float:
    """Peak activation bytes on `rank`: max over its order of sum(in-flight x kept) + transient.

    `kept_bytes[s]` / `transient_bytes[s]` are per global stage (StageCost.kept_bytes and
    .transient_bytes); the transient counts only while a B or I of that stage runs.
    """
    if not 0 <= rank < schedule.n_ranks:
        raise ScheduleError(f"rank {rank} is outside 0..{schedule.n_ranks - 1}")
    return activation_peaks(schedule, kept_bytes, transient_bytes)[rank]
