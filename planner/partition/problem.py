"""The stage-cut problem as plain arrays, shared by the DP, the ILP and brute force.

An instance fixes everything but the cuts and the recompute sets: per-layer costs at one
micro-batch size, and per stage position s (0..S-1) the device's speed, its memory budget,
the schedule's in-flight count k_s and the links to the neighbouring positions.

A solution is S contiguous non-empty layer ranges [i_s, j_s) and a recompute set R_s per stage.

Stage time (one micro-batch, ms; planner.cost.stage_time_ms):
    t_s = (sum_{l in [i,j)} compute_l + sum_{l in R_s} recompute_l) / speed_s + overhead_s
          + send(s-1 <- s, boundary_bytes[i])   (input gradient back; s > 0)
          + send(s -> s+1, boundary_bytes[j])   (output forward;    s < S-1)
    send = latency + bytes x ms_per_byte of that link (0 when no bytes cross it; planner.cost.transfer_ms)
Stage memory (bytes; planner.cost.stage_bytes at the schedule's memory moments of position s):
    m_s = sum static_l + buffers(i, j)
          + max(optimizer step, max over moments (c, t, g) of c kept + [t] transient - [not g] sum grad_l)
    kept = sum_{l not in R} activation_l + sum_{l in R} input_l + passthrough(i, j) (+ held output,
    entry correction), transient = max_{l in [i,j)} workspace_l + [l in R] rematerialized_l
    (planner.cost.transient: one layer's backward at a time; rematerialized_l is activation_l less
    what l's checkpoint keeps besides its input, the loss's tensors on the last layer); a moment
    holds c micro-batches, the transient if a backward runs then (t), and the gradients if they
    exist by then (g) (planner.schedules.memory.stage_memory_moments). Without moments: one
    moment (k_s, t, g).
For a model that is not a chain (planner.graph) boundary_bytes are the crossing bytes of each
cut (skip tensors included), input_l what layer l reads from all earlier layers, and
passthrough(i, j) the skip tensors the stage only forwards (produced before i, read at or
after j, read nowhere in [i, j)): a term of the stage as a whole, not of its layers, so the
DP and ILP take it from `passthrough_table` / `passthrough_edges`. 0 for a chain.
Objective: minimise the bottleneck max_s t_s; among plans with that bottleneck (within
TIME_TOL), minimise the total sum_s t_s; subject to m_s <= budget_s for every s.

Recompute sets come from a family fixed by `recompute`:
  none  R = {}
  all   R = every layer of the stage
  auto  R = the first q "saving" layers of the stage (index order), q free per stage, where a
        layer saves memory when recomputed iff activation_l > input_l (others never help).
        This is Megatron-LM's "block" recompute granularity per stage; the search refines the
        chosen cuts' sets afterwards (planner.partition.recompute).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.cost import (
    stage_batch_bytes, fixed_bytes, moment_bytes, kept_bytes, stage_time_ms, transfer_ms, transient_bytes, workspace_max,
)
from planner.cost import stage_bytes as cost_stage_bytes
from planner.cost.held import held_output, running_i_extra, sent_bytes, stage_wgrad
from planner.cost.w_workspace import stage_w_workspace
from planner.graph.crossing import passthrough_bytes
from planner.schedules.memory import Moment

__all__ = [
    "band_starts",
    "first_true",
    "position_key",
    "relax_window",
    "RELAX_COLUMNS",
    "stage_window",
    "RECOMPUTE_MODES",
    "TIME_TOL",
    "PartitionProblem",
    "Solution",
    "stage_time",
    "stage_bytes",
    "moments",
    "moment_terms",
    "evaluate",
    "recompute_family",
    "saving_layers",
    "rematerialized",
    "fits",
    "stage_passthrough",
    "passthrough_table",
]

RECOMPUTE_MODES = ("auto", "none", "all")
TIME_TOL = 1e-9  # relative: stage times within this of the bottleneck count as equal to it


@dataclass(frozen=True)
class PartitionProblem:
    """One instance: layer arrays (length L) and stage-position arrays (length S)."""

    compute_ms: np.ndarray
    """Forward + backward of each layer for one micro-batch at speed 1 (calibrated), ms."""
    recompute_ms: np.ndarray
    """Extra time when the layer is recomputed (its forward again, calibrated), ms."""
    static_bytes: np.ndarray
    """Weights + gradients + optimizer state of each layer, bytes."""
    activation_bytes: np.ndarray
    """Bytes each layer keeps for its backward per micro-batch."""
    input_bytes: np.ndarray
    """Bytes a recomputed layer keeps instead (its input) per micro-batch."""
    boundary_bytes: np.ndarray
    """Length L+1: bytes crossing a cut before layer x (0 at x = 0 and x = L)."""
    inflight: np.ndarray
    """Per stage position: micro-batches whose activations it holds at peak (k_s)."""
    budget: np.ndarray
    """Per stage position: memory budget in bytes (inf = unlimited)."""
    speed: np.ndarray
    """Per stage position: relative speed of its device (divides compute time)."""
    overhead_ms: np.ndarray
    """Per stage position: fixed time per micro-batch (calibrated per-action overhead), ms."""
    link_latency_ms: np.ndarray
    """Length S-1: latency of the link between positions s and s+1, ms."""
    link_ms_per_byte: np.ndarray
    """Length S-1: transfer ms per byte between positions s and s+1 (0 on one device)."""
    recompute: str = "auto"
    """Recompute family: auto, none or all (module docstring)."""
    passthrough_edges: tuple = ()
    """Skip edges (planner.graph.SkipEdge) whose `bytes_per_sample` holds bytes per micro-batch; () for a chain."""
    workspace_bytes: np.ndarray | None = None
    """Per layer, bytes alive at its worst moment beyond what it keeps (planner.cost.transient); None: 0."""
    optimizer_workspace_bytes: np.ndarray | None = None
    """Per layer, the optimizer step's temporaries (planner.cost.optimizer_workspace, the stage's largest); None: 0."""
    held_output_bytes: np.ndarray | None = None
    """Per layer, its output's bytes the runtime holds per micro-batch when a stage ends with it (planner.cost.held_output); None: 0."""
    entry_bytes: np.ndarray | None = None
    """Per layer x, the kept-bytes correction of a stage starting at x (planner.cost.stage_entry_bytes); None: 0."""
    recv_microbatches: int | None = None
    """Micro-batches torch's stages keep receive buffers for (planner.cost.buffer_bytes); None: the older model."""
    batch_input_bytes: float = 0.0
    """The model input per micro-batch: the first stage holds the step's batch of it (with recv_microbatches)."""
    batch_target_bytes: float = 0.0
    """The target per micro-batch: the last stage holds the step's batch of it (with recv_microbatches)."""
    moments: tuple | None = None
    """Per stage position, its memory moments (planner.schedules.memory.Moment tuples); None: one
    moment of `inflight` micro-batches with the transient and the gradients (the older bound)."""
    gradient_bytes: np.ndarray | None = None
    """Per layer, its parameter gradients' bytes (part of static_bytes), absent at moments before the
    stage's first weight-gradient action; None: 0 (only meaningful with moments)."""
    wgrad_bytes: np.ndarray | None = None
    """Per layer, bytes a split backward holds per micro-batch between its I and W, charged at each
    moment's pending_w (planner.cost.held.stage_wgrad: none on the first stage); None: 0, and nothing its
    sends hold is charged either (planner.cost.held.sent_bytes)."""
    rematerialized_bytes: np.ndarray | None = None
    """Per layer, what its recompute brings back during its backward, its transient term with the
    workspace (planner.cost.transient.rematerialized_bytes); None: activation_bytes."""
    loss_saved_bytes: float = 0.0
    """What the loss saves per micro-batch, freed at the last stage's I when the backward is split
    (planner.cost.held.loss_saved_bytes, priced through sent_bytes' pending term)."""
    w_workspace_bytes: np.ndarray | None = None
    """Per layer, what its split W holds alone beyond the gradients, charged at each moment's running_w
    (planner.cost.w_workspace: none on the first stage); None: 0."""
    w_carry_bytes: np.ndarray | None = None
    """Per layer, its last parameter group's fresh weight gradients, held into the next layer's W; None: 0."""

    @property
    def n_layers(self) -> int:
        return len(self.compute_ms)

    @property
    def n_stages(self) -> int:
        return len(self.inflight)


@dataclass(frozen=True)
class Solution:
    """Stage cuts and recompute sets with their objective values."""

    cuts: tuple[int, ...]
    """Length S+1: stage s covers layers [cuts[s], cuts[s+1])."""
    recompute: tuple[tuple[int, ...], ...]
    """Per stage: recomputed layers."""
    bottleneck_ms: float
    """max over stages of the stage time."""
    total_ms: float
    """Sum of stage times."""
    stage_ms: tuple[float, ...]
    """Per stage time."""
    stage_bytes: tuple[float, ...]
    """Per stage memory."""
    method: str
    """Solver that produced it (dp, ilp, brute, uniform, params, time)."""
    optimal: bool = True
    """False when a solver stopped before proving optimality (ILP time limit) or for baselines."""


def rematerialized(p: PartitionProblem) -> np.ndarray:
    """Per layer, what its recompute brings back (PartitionProblem.rematerialized_bytes, or activation_bytes)."""
    return p.activation_bytes if p.rematerialized_bytes is None else p.rematerialized_bytes


def saving_layers(p: PartitionProblem) -> np.ndarray:
    """Boolean mask: layers whose recompute lowers kept bytes (activation > input)."""
    return p.activation_bytes > p.input_bytes


def _send(p: PartitionProblem, boundary: int, nbytes: float) -> float:
    return transfer_ms(nbytes, p.link_latency_ms[boundary], p.link_ms_per_byte[boundary])


def stage_time(p: PartitionProblem, s: int, i: int, j: int, rec: tuple[int, ...]) -> float:
    """Time t_s of layers [i, j) at position s with `rec` recomputed (planner.cost.stage_time_ms)."""
    return float(stage_time_ms(
        float(np.sum(p.compute_ms[i:j])), float(sum(p.recompute_ms[l] for l in rec)), float(p.speed[s]), float(p.overhead_ms[s]),
        _send(p, s - 1, float(p.boundary_bytes[i])) if s > 0 else 0.0,
        _send(p, s, float(p.boundary_bytes[j])) if s < p.n_stages - 1 else 0.0,
    ))


def stage_passthrough(p: PartitionProblem, i: int, j: int) -> float:
    """Bytes per micro-batch stage [i, j) holds for skip tensors it only forwards (0 for a chain)."""
    if not p.passthrough_edges:
        return 0.0
    return passthrough_bytes(i, j, p.passthrough_edges)


def passthrough_table(p: PartitionProblem) -> np.ndarray | None:
    """(L+1, L+1) array: [i, j] = stage_passthrough(p, i, j) where i < j; None for a chain.

    A skip tensor with producer src and readers c_1 < ... < c_m is held by stage [i, j)
    exactly when, for two consecutive points a < b of (src, c_1, ..., c_m), a < i < j <= b:
    a block of the table per gap, added with a 2-D difference array (O(edges x readers + L^2)).
    One np.add.at adds the corners in the order a loop over the gaps would, so the floats match.
    """
    if not p.passthrough_edges:
        return None
    L = p.n_layers
    rows, cols, weights = [], [], []  # the four corners of each gap's block, in loop order
    for e in p.passthrough_edges:
        points, w = (e.src,) + tuple(e.also_to) + (e.dst,), float(e.bytes_per_sample)
        for a, b in zip(points, points[1:]):
            rows += (a + 1, a + 1, b + 1, b + 1)
            cols += (a + 1, b + 1, a + 1, b + 1)
            weights += (w, -w, -w, w)
    diff = np.zeros((L + 2, L + 2))
    np.add.at(diff, (np.array(rows, dtype=np.intp), np.array(cols, dtype=np.intp)), np.array(weights, dtype=float))
    np.cumsum(diff, axis=0, out=diff)  # in place: one (L+2)^2 array alive, not three
    np.cumsum(diff, axis=1, out=diff)
    return diff[: L + 1, : L + 1]


def moments(p: PartitionProblem, s: int) -> tuple:
    """Position s's memory moments (planner.schedules.memory.Moment), the older bound's one moment
    of inflight[s] micro-batches with the transient and the gradients where the problem has none."""
    if p.moments is None:
        return (Moment(float(p.inflight[s]), True, True),)
    return tuple(p.moments[s])


def stage_bytes(p: PartitionProblem, s: int, i: int, j: int, rec: tuple[int, ...]) -> float:
    """Memory m_s of layers [i, j) at position s with `rec` recomputed (planner.cost.stage_bytes)."""
    return float(cost_stage_bytes(
        float(np.sum(p.static_bytes[i:j])), float(p.boundary_bytes[i]), float(p.boundary_bytes[j]), float(p.inflight[s]),
        kept_bytes(p.activation_bytes, p.input_bytes, i, j, rec, p.passthrough_edges, p.held_output_bytes, p.entry_bytes),
        transient_bytes(rematerialized(p), rec, p.workspace_bytes, i, j),
        workspace_max(p.optimizer_workspace_bytes, i, j),
        p.recv_microbatches, stage_batch_bytes(p.batch_input_bytes, p.batch_target_bytes, i == 0, j == p.n_layers),
        float(np.sum(p.gradient_bytes[i:j])) if p.gradient_bytes is not None else 0.0, moments(p, s),
        stage_wgrad(p.wgrad_bytes, i, j), _sent(p, i, j), held_output(p.held_output_bytes, j),
        running_i_extra(p.workspace_bytes, p.wgrad_bytes, i, j), stage_w_workspace(p.w_workspace_bytes, p.w_carry_bytes, i, j),
    ))


def _sent(p: PartitionProblem, i: int, j: int) -> tuple[float, float, float]:
    """What stage [i, j)'s sends and pending W hold (planner.cost.held.sent_bytes)."""
    return sent_bytes(float(p.boundary_bytes[i]), float(p.boundary_bytes[j]), held_output(p.held_output_bytes, j),
                      p.wgrad_bytes is not None, j == p.n_layers, p.loss_saved_bytes)


def moment_terms(p: PartitionProblem, s: int, i: int, j: int) -> tuple[float, tuple[float, ...], float]:
    """Layers [i, j) at position s without recompute: (fixed bytes, each moment's bytes beyond them,
    the optimizer step's temporaries). stage_bytes(p, s, i, j, ()) is fixed + the largest of the
    moments and max(step, 0); recomputing lowers each moment by recompute_saving with its own count
    (and its transient only where a backward runs then)."""
    kept = kept_bytes(p.activation_bytes, p.input_bytes, i, j, (), p.passthrough_edges, p.held_output_bytes, p.entry_bytes)
    grads = float(np.sum(p.gradient_bytes[i:j])) if p.gradient_bytes is not None else 0.0
    work = workspace_max(p.workspace_bytes, i, j)
    fixed = fixed_bytes(float(np.sum(p.static_bytes[i:j])), float(p.boundary_bytes[i]), float(p.boundary_bytes[j]),
                        p.recv_microbatches, stage_batch_bytes(p.batch_input_bytes, p.batch_target_bytes, i == 0, j == p.n_layers))
    wgrad = stage_wgrad(p.wgrad_bytes, i, j)
    out = held_output(p.held_output_bytes, j)
    running = running_i_extra(p.workspace_bytes, p.wgrad_bytes, i, j)
    w_work = stage_w_workspace(p.w_workspace_bytes, p.w_carry_bytes, i, j)
    held = tuple(float(moment_bytes(m, kept, work, grads, wgrad, _sent(p, i, j), out, running, w_work, float(p.boundary_bytes[j])))
                 for m in moments(p, s))
    return float(fixed), held, workspace_max(p.optimizer_workspace_bytes, i, j)


def recompute_family(p: PartitionProblem, i: int, j: int) -> list[tuple[int, ...]]:
    """Every recompute set the problem's family allows for a stage [i, j), cheapest first."""
    if p.recompute == "none":
        return [()]
    if p.recompute == "all":
        return [tuple(range(i, j))]
    saving = [l for l in range(i, j) if p.activation_bytes[l] > p.input_bytes[l]]
    return [tuple(saving[:q]) for q in range(len(saving) + 1)]


def evaluate(p: PartitionProblem, cuts: tuple[int, ...], recompute: tuple[tuple[int, ...], ...],
             method: str, optimal: bool = True) -> Solution:
    """A Solution with stage times and memory computed directly from the definitions."""
    S = len(cuts) - 1
    times = tuple(stage_time(p, s, cuts[s], cuts[s + 1], recompute[s]) for s in range(S))
    mems = tuple(stage_bytes(p, s, cuts[s], cuts[s + 1], recompute[s]) for s in range(S))
    return Solution(
        cuts=tuple(int(c) for c in cuts),
        recompute=tuple(tuple(int(l) for l in r) for r in recompute),
        bottleneck_ms=max(times),
        total_ms=float(sum(times)),
        stage_ms=times,
        stage_bytes=mems,
        method=method,
        optimal=optimal,
    )


def fits(p: PartitionProblem, sol: Solution) -> bool:
    """True when every stage is within its position's budget."""
    return all(m <= float(b) for m, b in zip(sol.stage_bytes, p.budget))


# Per-(i, j) tables and the windows of cuts a stage can take, for the solvers.

def stage_window(L: int, S: int, s: int) -> tuple[int, int, int, int]:
    """(first start, last start, first end, last end) of stage s of S over L layers: it can only
    end before layer s+1 .. L-(S-1-s) (every later stage needs a layer), and starts where stage
    s-1 can end (layer 0 for s = 0)."""
    if s == 0:
        return 0, 0, 1, L - S + 1
    return s, L - S + s, s + 1, L - S + s + 1


def first_true(lo: np.ndarray, hi: np.ndarray, test) -> np.ndarray:
    """Per element, the least x in [lo, hi] with test(x) true, hi + 1 when none (test monotone in x)."""
    lo, hi = lo.copy(), hi + 1
    while True:
        active = lo < hi
        if not active.any():
            return lo
        mid = (lo + hi) // 2
        ok = test(np.minimum(mid, hi - 1)) & active
        hi = np.where(ok, mid, hi)
        lo = np.where(active & ~ok, mid + 1, lo)




def band_starts(pc: np.ndarray, limit: float) -> np.ndarray:
    """Per end j, the least start i with pc[j] - pc[i] <= limit (j + 1 when none), for prefix sums
    pc of compute: earlier starts only add compute. All 0 where the limit is inf or pc ever falls."""
    n = len(pc)
    if not np.isfinite(limit) or bool(np.any(np.diff(pc) < 0)):
        return np.zeros(n, dtype=np.int64)
    ends = np.arange(n)
    return first_true(np.zeros(n, dtype=np.int64), ends, lambda i: pc[ends] - pc[i] <= limit)






def position_key(p: PartitionProblem, s: int) -> tuple:
    """What a stage table at position s depends on: equal keys, equal tables."""
    S = p.n_stages
    lin = (float(p.link_latency_ms[s - 1]), float(p.link_ms_per_byte[s - 1])) if s > 0 else None
    lout = (float(p.link_latency_ms[s]), float(p.link_ms_per_byte[s])) if s < S - 1 else None
    return (float(p.inflight[s]), moments(p, s), float(p.budget[s]), float(p.speed[s]), float(p.overhead_ms[s]), lin, lout)


RELAX_COLUMNS = 128
"""Ends relax_window relaxes at once: a block of them needs only the starts inside their band (a
tuning constant: any value >= 1 gives the same result; small ones exercise many blocks)."""


def relax_window(prev: np.ndarray, t: np.ndarray, rows: np.ndarray, limit: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per column c of a stage's window: min over rows r of max(prev[r], t[r, c]) (limit None), or
    of prev[r] + t[r, c] over t[r, c] <= limit with the first such r (its argmin). Rows before
    rows[c] (non-decreasing) or after c are inf in t, so each block of columns skips them."""
    n = t.shape[1]
    best, arg = np.full(n, np.inf), np.zeros(n, dtype=np.int64)
    for c0 in range(0, n, RELAX_COLUMNS):
        c1 = min(n, c0 + RELAX_COLUMNS)
        r0, r1 = int(rows[c0]), min(t.shape[0], c1)  # row r starts before column c's end when r <= c
        if r0 >= r1:
            continue
        sub = t[r0:r1, c0:c1]
        if limit is None:
            best[c0:c1] = np.maximum(prev[r0:r1, None], sub).min(axis=0)
            continue
        cand = prev[r0:r1, None] + np.where(sub <= limit, sub, np.inf)
        a = cand.argmin(axis=0)
        arg[c0:c1] = a + r0
        best[c0:c1] = cand[a, np.arange(c1 - c0)]
    return best, arg
