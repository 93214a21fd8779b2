"""A cheap proof that a point of the cluster search fits no cut, before its memory moments are derived.

Most points of a cluster search fit no cut at all (254 of the 305 the GPT-175B search on 1,536
A100s solves), and learning that exactly needs the schedule's memory moments (deriving them was
a third of that search) and a memory-only DP per point (planner.partition.dp.min_memory_scale).
A lower bound says the same for most of them at a fraction of the cost:

- At the start of a stage's first backward (B or I) it holds every micro-batch it ran forward
  before it: `first_backward_counts`, read from the schedule's order alone (no memory states). That
  moment is one of the stage's memory moments, so the DP charges the stage at least its bytes.
- Those bytes are at least static + k x kept activations - gradients (buffers, pass-through
  tensors, the held output, the transient, wgrad and sends only add; gradients may not exist yet;
  the entry correction of kept bytes is at least its smallest value): per layer a sum, so a
  stage's floor grows as it takes more layers.
- With such costs the cut that reaches furthest stage by stage fits whenever any cut fits (a stage
  that starts later and ends no later costs no more), so one greedy pass decides: when it cannot
  reach the last layer within the stages, no cut fits the floor, and none fits the DP's prices.

The floor only ever drops points the DP would find infeasible; the search still solves every point
the floor lets through exactly (tests/test_memory_floor.py holds the floor under the DP's least bytes).
"""

from __future__ import annotations

import functools

import numpy as np

from planner.partition.problem import PartitionProblem
from planner.schedules import get_schedule
from planner.schedules.actions import ActionKind
from planner.schedules.registry import SCHEDULES

__all__ = ["first_backward_counts", "fits_no_cut", "schedule_counts"]

_BACKWARDS = (ActionKind.FULL_BACKWARD, ActionKind.BACKWARD_INPUT)


@functools.lru_cache(maxsize=256)
def first_backward_counts(name: str, p: int, m: int, v: int) -> tuple[int, ...]:
    """Per stage (P x v of them): the micro-batches it ran forward before its first backward, in its
    rank's order of schedule `name` (sizes valid: check_sizes passed), at least 1."""
    order = SCHEDULES[name].order(p, m, v)
    counts = [0] * (p * v)
    started: set[int] = set()
    for acts in order.values():
        for a in acts:
            if a is None or a.stage in started:
                continue
            if a.kind == ActionKind.FORWARD:
                counts[a.stage] += 1
            elif a.kind in _BACKWARDS:
                started.add(a.stage)
    return tuple(max(1, c) for c in counts)


def fits_no_cut(prob: PartitionProblem, counts: tuple[int, ...], split_backward: bool, holds_sends: bool) -> bool:
    """True when no cut of `prob` into its stage positions keeps every stage's floor (module
    docstring, with `counts` from first_backward_counts) within its budget: then the DP fits none.
    False when one might (or the floor cannot be summed per layer: the DP decides).

    With `split_backward` the first backward is an I, which holds its micro-batch's wgrad already
    (planner.cost.held.stage_wgrad: on every stage but one starting at layer 0). With `holds_sends`
    a second moment counts too: after the stage's last action its sends still hold every
    micro-batch's input gradient and output (planner.cost.held.sent_bytes), nothing in flight."""
    if prob.recompute not in ("none", "all") or prob.n_stages != len(counts):
        return False
    static = np.asarray(prob.static_bytes, dtype=float)
    grads = np.zeros_like(static) if prob.gradient_bytes is None else np.asarray(prob.gradient_bytes, dtype=float)
    kept = np.asarray(prob.input_bytes if prob.recompute == "all" else prob.activation_bytes, dtype=float)
    measured = prob.wgrad_bytes is not None
    wgrad = np.asarray(prob.wgrad_bytes, dtype=float) if split_backward and measured else 0.0
    entry = 0.0 if prob.entry_bytes is None else min(0.0, float(np.min(prob.entry_bytes)))
    L, S, at = len(static), len(counts), 0
    bb = np.asarray(prob.boundary_bytes, dtype=float)
    inner = float(np.min(bb[1:L])) if L > 1 else 0.0  # the least a cut inside the model sends
    buffers = 2.0 if prob.recv_microbatches is None else float(prob.recv_microbatches)
    m = max(counts) if prob.recv_microbatches is None else prob.recv_microbatches
    static_prefix = np.concatenate([[0.0], np.cumsum(static)])
    if (static < 0).any():
        return False
    for s, k in enumerate(counts):
        # what crosses the stage's two ends, at least (nothing before layer 0 or after the last)
        ends = (inner if s > 0 else 0.0) + (inner if s < S - 1 else 0.0)
        # (stage s > 0 of any cut starts past layer 0, where the wgrad counts)
        per_layer = static - grads + k * kept + (wgrad if s else 0.0)
        budget = float(prob.budget[s])
        if (per_layer < 0).any() or not np.isfinite(budget):
            return False  # not monotone in the layers it takes, or no limit: the greedy pass proves nothing
        prefix = np.concatenate([[0.0], np.cumsum(per_layer)])
        room = budget - buffers * ends
        # the furthest end j whose first-backward floor fits: prefix[j] - prefix[at] + k * entry <= room
        end = int(np.searchsorted(prefix, prefix[at] + room - k * entry, side="right")) - 1
        if holds_sends and measured:  # and whose end-of-step floor fits: static + M x (in + out) held
            end = min(end, int(np.searchsorted(static_prefix, static_prefix[at] + room - m * ends, side="right")) - 1)
        at = max(at, end)
        if at >= L:
            return False
    return True


def schedule_counts(name: str, p: int, m: int, small: int, v: int) -> tuple[int, ...]:
    """first_backward_counts at M = `m` from the schedule at `small` micro-batches (the size the
    moments are derived at, planner.partition.parallel_eval.memory_moments): the same, but GPipe's,
    which runs every micro-batch forward first."""
    got = first_backward_counts(name, p, small, v)
    extra = m - small
    return tuple(c + extra for c in got) if extra and get_schedule(name).holds_every_microbatch else got
