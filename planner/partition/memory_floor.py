"""A cheap proof that a point of the cluster search fits no cut, before its memory moments are derived.

Most points of a cluster search fit no cut at all (254 of the 305 the GPT-175B search on 1,536
A100s solves), and learning that exactly needs the schedule's memory moments (deriving them was
a third of that search) and a memory-only DP per point (planner.partition.dp.min_memory_scale).
A lower bound says the same for most of them at a fraction of the cost:

- A few of each stage's memory states are read from the schedule's order alone, with no state
  table (`stage_snapshots`): at its first backward (every micro-batch it ran forward before is
  in flight), at its last forward (in a held-sends schedule the sends of all but the micro-batches
  in flight are held by then), and after its last action (every send held, nothing in flight).
  Each is one of the stage's memory moments, or below one, so the DP charges the stage at least
  its bytes.
- Those bytes are at least a sum over the stage's layers (static, kept activations per micro-batch
  in flight, wgrad per pending W, less gradients not yet made) plus what the cuts inside the model
  send at the least (held sends, buffers) and the entry correction at its smallest: the transient,
  pass-through tensors and the held output only add, so they are left out.
- With such costs the cut that reaches furthest stage by stage fits whenever any cut fits (a stage
  that starts later and ends no later costs no more), so one greedy pass decides: when it cannot
  reach the last layer within the stages, no cut fits the floor, and none fits the DP's prices.

The floor only ever drops points the DP would find infeasible; the search still solves every point
the floor lets through exactly (tests/test_memory_floor.py holds it to the DP's least memory).
"""

from __future__ import annotations

import functools

import numpy as np

from planner.partition.problem import PartitionProblem
from planner.schedules import get_schedule
from planner.schedules.actions import ActionKind
from planner.schedules.memory import Moment, with_more_microbatches
from planner.schedules.registry import SCHEDULES, holds_sends

__all__ = ["stage_snapshots", "schedule_snapshots", "fits_no_cut"]

# The floor can equal the DP's price (a 1F1B stage at its last forward: nothing else held), and
# the two sum the same bytes in other orders: a point is dropped only when its floor is over the
# budget by more than this fraction, far above float rounding and far below what decides a plan.
_SLACK = 1e-6


@functools.lru_cache(maxsize=256)
def stage_snapshots(name: str, p: int, m: int, v: int) -> tuple[tuple[Moment, ...], ...]:
    """Per stage (P x v of them): its state at its first backward, at its last forward and (where
    sends are held or W split) after its last action, as planner.schedules.memory_states counts
    them (a micro-batch in flight from its F to its B, or W when the backward is split; sends held
    per ended I, and per ended B where the runtime holds sends), in its rank's order of schedule
    `name` (sizes valid: check_sizes passed)."""
    split = get_schedule(name).split_backward
    held = holds_sends(name, split)
    F, B, I, W = ActionKind.FORWARD, ActionKind.FULL_BACKWARD, ActionKind.BACKWARD_INPUT, ActionKind.BACKWARD_WEIGHT
    frees = W if split else B
    n = p * v
    fwd, freed, i_end, w_end, b_end = ([0] * n for _ in range(5))
    # counters (forwards, freed, I ended, W ended, B ended) at each stage's first backward and last
    # forward, as plain tuples: this pass runs over up to 128 ranks x hundreds of actions
    first: list[tuple | None] = [None] * n
    last_f: list[tuple | None] = [None] * n
    for acts in SCHEDULES[name].order(p, m, v).values():
        for a in acts:
            if a is None:
                continue
            x, kind = a.stage, a.kind
            if kind is F:
                fwd[x] += 1
                last_f[x] = (fwd[x], freed[x], i_end[x], w_end[x], b_end[x], False)
                continue
            if first[x] is None and kind is not W:
                first[x] = (fwd[x], freed[x], i_end[x], w_end[x], b_end[x], kind is I)
            if kind is frees:
                freed[x] += 1
            if kind is I:
                i_end[x] += 1
            elif kind is W:
                w_end[x] += 1
            elif kind is B:
                b_end[x] += 1

    def state(counts: tuple | None, transient: bool) -> Moment | None:
        if counts is None:
            return None
        f, fr, ie, we, be, running = counts
        return Moment(f - fr, transient, fr > 0, ie - we, ie + (be if held else 0), running)

    def states(x: int) -> tuple[Moment, ...]:
        # the state after the last action is a state of its own only where sends are held (or W split)
        end = (fwd[x], freed[x], i_end[x], w_end[x], b_end[x], False) if split or held else None
        return tuple(y for y in (state(first[x], True), state(last_f[x], False), state(end, False)) if y is not None)

    return tuple(states(x) for x in range(n))


def schedule_snapshots(name: str, p: int, m: int, small: int, v: int) -> tuple[tuple[Moment, ...], ...]:
    """stage_snapshots at M = `m` from the schedule at `small` micro-batches, moved as
    planner.partition.parallel_eval.memory_moments moves the moments derived there: the M - M' more
    micro-batches add to the sends held (once any is) and to GPipe's micro-batches in flight."""
    got = stage_snapshots(name, p, small, v)
    extra = m - small
    if not extra:
        return got
    grows = get_schedule(name).holds_every_microbatch
    return tuple(tuple(with_more_microbatches(x, extra, grows) for x in stage) for stage in got)


def fits_no_cut(prob: PartitionProblem, snapshots: tuple[tuple[Moment, ...], ...]) -> bool:
    """True when no cut of `prob` into its stage positions keeps every stage's floor (module
    docstring) at each of its `snapshots` (schedule_snapshots) within its budget: then the DP fits
    none. False when one might (or the floor cannot be summed per layer: the DP decides)."""
    S = len(snapshots)
    if prob.recompute not in ("none", "all") or prob.n_stages != S:
        return False
    static = np.asarray(prob.static_bytes, dtype=float)
    L = len(static)
    grads = np.zeros(L) if prob.gradient_bytes is None else np.asarray(prob.gradient_bytes, dtype=float)
    kept = np.asarray(prob.input_bytes if prob.recompute == "all" else prob.activation_bytes, dtype=float)
    measured = prob.wgrad_bytes is not None  # what sends hold and each pending W keeps: only with the column
    wgrad = np.asarray(prob.wgrad_bytes, dtype=float) if measured else np.zeros(L)
    entry = 0.0 if prob.entry_bytes is None else min(0.0, float(np.min(prob.entry_bytes)))
    # what the last stage's I frees per micro-batch: its held output and the loss's saved tensors (pending_output)
    held_last = (0.0 if prob.held_output_bytes is None else float(prob.held_output_bytes[-1])) + prob.loss_saved_bytes
    bb = np.asarray(prob.boundary_bytes, dtype=float)
    inner = float(np.min(bb[1:L])) if L > 1 else 0.0  # the least a cut inside the model sends
    buffers = 2.0 if prob.recv_microbatches is None else float(prob.recv_microbatches)
    at = 0
    for s, stage in enumerate(snapshots):
        if not np.isfinite(prob.budget[s]):
            return False  # no limit: the greedy pass proves nothing
        budget = float(prob.budget[s]) * (1.0 + _SLACK)
        bytes_in, bytes_out = (inner if s > 0 else 0.0), (inner if s < S - 1 else 0.0)
        reach = L
        for x in stage:
            # per layer; stage s > 0 of any cut starts past layer 0, where a pending W holds its wgrad, and a running I
            # at least its stage's (its transient + running_i_extra reach the stage's wgrad sum: a floor still)
            per_layer = static - (0.0 if x.gradients else grads) + x.in_flight * kept
            if s > 0 and (x.pending_w or x.running_i):
                per_layer = per_layer + (x.pending_w + x.running_i) * wgrad
            if (per_layer < 0).any():
                return False  # not monotone in the layers it takes: the greedy pass would prove nothing
            # per stage, at the least: buffers, held sends (planner.cost.held.sent_bytes), the entry
            # correction, and on the last stage a pending W's output and loss tensors already gone (pending_output)
            fixed = buffers * (bytes_in + bytes_out) + x.in_flight * entry - (x.pending_w * held_last if s == S - 1 else 0.0)
            if measured:
                fixed += x.sent_grads * bytes_in + (x.sent_grads - x.pending_w) * bytes_out
            prefix = np.concatenate([[0.0], np.cumsum(per_layer)])
            # the furthest end j with prefix[j] - prefix[at] + fixed <= budget
            reach = min(reach, int(np.searchsorted(prefix, prefix[at] + budget - fixed, side="right")) - 1)
        at = max(at, reach)
        if at >= L:
            return False
    return True
