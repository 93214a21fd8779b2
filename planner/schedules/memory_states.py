"""A schedule's memory states as one table, and the memory peaks over it (numpy, no timing).

planner.schedules.memory describes what a stage holds at each point of its rank's order; this
module stores the distinct states of every rank once per schedule (cached on the immutable
schedule object: the partitioner simulates the same schedule with thousands of different cuts)
and evaluates a rank's peak over all of them with array operations. Each state's bytes are
summed in the same order as the scalar definition (memory_peaks' docstring, walked action by action
in tests/test_search_scale.py), so every figure is the same float, bit for bit.

With a split backward (zero bubble) two more things follow torch's runtime: a running I stores its
micro-batch's wgrads as the backward runs, not when I ends (the `running` column, priced by
planner.cost.held.running_i_extra), and the first stage's backward runs at W, its I computing no input gradient
(the transient lives during W there, `bwd`). Where the runtime holds its sends until the step ends
(registry `holds_sends`: zb, interleaved) the `sent` column counts what it sent (ended I, or ended B
for a whole backward, which is an ended I and W at once), and each rank has one state more, after
its last action, when its sends still hold every input gradient and output until the step waits
for them. Where torch's class keeps its warm-up's last forward send through its steady phase
(registry `holds_warmup_send`: 1F1B) the `warm` column marks the states in which that output
outlives its backward.

Most states can never be the peak: one that holds no more of anything than another state of its
rank (micro-batches, stage outputs, pending W, ended I and W, gradients, the transient) is at most
that one's bytes whenever every price is non-negative. `state_front` finds those maximal states
(once, on first use), and `memory_peaks_table` prices only them when exactness is certain (module
function docstring); otherwise it prices every state.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.schedules.actions import PipelineSchedule
from planner.schedules.compiled import CODE_B, CODE_F, CODE_I, CODE_W, CompiledSchedule, compile_schedule
from planner.schedules.registry import holds_sends, holds_warmup_send

__all__ = ["FRONT_ROUNDS", "StateTable", "state_table", "state_front", "pareto_front", "memory_peaks_table", "activation_peaks_table"]

_ATTR = "_pplan_state_table"
_FRONT_ATTR = "_pplan_state_front"
# Integer sums below this are exact in float64, whatever their order (2**53, less a margin).
_EXACT_BOUND = float(2**52)

FRONT_ROUNDS = 64
"""Rows the table's front takes one by one per rank before it keeps the rest unpruned
(pareto_front): zero-bubble states barely prune, and the cap keeps building their table short."""


@dataclass(frozen=True)
class StateTable:
    """Every rank's distinct memory states, stacked rank after rank (rows), one column per local stage."""

    rank_stages: tuple[tuple[int, ...], ...]
    """rank -> its stages, ascending (column i of a rank's rows is its i-th stage)."""
    stage_of: np.ndarray
    """(ranks, width) global stage of each column; -1 where a rank has fewer stages than width."""
    starts: np.ndarray
    """(ranks + 1,) first row of each rank's states; rank r owns rows starts[r]:starts[r + 1]."""
    row_rank: np.ndarray
    """(rows,) the rank of each row."""
    during: np.ndarray
    """(rows, width) micro-batches whose activations the stage holds."""
    bwd: np.ndarray
    """(rows,) the global stage whose backward (B or I) runs then, -1 for none."""
    grads: np.ndarray
    """(rows, width) 1 where the stage's parameter gradients exist."""
    outputs: np.ndarray
    """(rows, width) stage outputs torch holds for the backward."""
    pending: np.ndarray
    """(rows, width) micro-batches whose I ended and whose W did not."""
    sent: np.ndarray
    """(rows, width) I actions ended so far, or B actions where the runtime holds its sends (each one's
    input gradient held until the step ends, and its output once its W or B ended)."""
    running: np.ndarray
    """(rows, width) 1 where an I of the stage runs: its micro-batch's wgrad is alive already."""
    wrun: np.ndarray
    """(rows, width) 1 where a W of the stage runs on a stage but the first, after the stage's first W
    of the step: its fresh weight gradients are alive beyond the stage's (planner.cost.w_workspace)."""
    warm: np.ndarray
    """(rows, width) 1 where the warm-up's last fired forward send still holds its micro-batch's output
    after that micro-batch's backward (registry holds_warmup_send; `warmup_send_rows`)."""
    largest: int
    """The largest count in any column (bounds the sums for the exactness check)."""


def state_table(schedule: PipelineSchedule) -> StateTable:
    """The schedule's StateTable (built once, then cached on the schedule object)."""
    cached = schedule.__dict__.get(_ATTR)
    if cached is None:
        cs = compile_schedule(schedule)
        cached = _build(cs, holds_sends(schedule.name, cs.split_backward), holds_warmup_send(schedule.name))
        object.__setattr__(schedule, _ATTR, cached)  # immutable schedule: safe private cache
    return cached


_GROUPS = 8  # per-stage column groups: during, grads, outputs, pending, sent, running, wrun, warm


def warmup_send_rows(kind: np.ndarray, microbatch: np.ndarray, col: np.ndarray, n: int) -> np.ndarray:
    """(actions, n) 1 during each action of a rank's order (kinds, micro-batches and local stage
    columns of its actions) at which torch's Schedule1F1B still holds a micro-batch's output only
    through its warm-up's last fired send (registry holds_warmup_send): with w >= 2 forwards of the
    stage before its first backward, micro-batch w - 2's, from the end of its B to the end of the
    first B after the stage's last F, when the class's steady loop ends and rebinds the send list."""
    out = np.zeros((kind.size, n), dtype=np.int64)
    for c in range(n):
        mine = np.flatnonzero(col == c)
        fwd, bwd = mine[kind[mine] == CODE_F], mine[kind[mine] == CODE_B]
        if bwd.size == 0:
            continue
        warmup = int(np.count_nonzero(fwd < bwd[0]))
        if warmup < 2:
            continue
        freed = bwd[microbatch[bwd] == microbatch[fwd[warmup - 2]]]
        released = bwd[bwd > fwd[-1]]
        if freed.size and released.size and freed[0] < released[0]:
            out[freed[0] + 1:released[0] + 1, c] = 1
    return out


def _rank_states(cs: CompiledSchedule, stages: tuple[int, ...], ids: np.ndarray, sends_held: bool,
                 warmup_send: bool = False) -> np.ndarray:
    """Distinct rows [during, bwd stage, grads, outputs, pending, sent, running, wrun, warm] of one rank, sorted.
    `sends_held`: the runtime keeps what it sent until the step ends (registry.holds_sends); an I's
    sends count either way (the runtime of split backwards holds them), a B's only with it.
    `warmup_send`: the class keeps its warm-up's last forward send (registry.holds_warmup_send)."""
    S, M, n = cs.n_stages, cs.n_microbatches, len(stages)
    if ids.size == 0:
        return np.concatenate([np.zeros(n, dtype=np.int64), [-1], np.zeros((_GROUPS - 1) * n, dtype=np.int64)])[None, :]
    local = np.full(S, -1, dtype=np.int64)
    local[list(stages)] = np.arange(n)
    key = ids // M
    kind, stage = key // S, key % S
    col = local[stage]
    rows = np.arange(ids.size)

    def marks(mask: np.ndarray) -> np.ndarray:
        """1 at (action, its stage's column) for the actions in `mask`."""
        out = np.zeros((ids.size, n), dtype=np.int64)
        out[rows[mask], col[mask]] = 1
        return out

    # +1 when F starts (before the action), -1 when the last backward action ends (after it):
    # B, or W when split (the weight gradient still needs the layer inputs)
    alloc = marks(kind == CODE_F)
    free = marks(((kind == CODE_B) | (kind == CODE_W)) if cs.split_backward else kind == CODE_B)
    during = np.cumsum(alloc, axis=0) - np.cumsum(free, axis=0) + free
    # when the transient lives: B or I, but W on the first stage (its I computes no input gradient)
    bwd_stage = np.where((kind == CODE_B) | ((kind == CODE_I) & (stage != 0)) | ((kind == CODE_W) & (stage == 0)), stage, -1)
    # gradients exist once an earlier action of the stage computed weight gradients, and during a split
    # W (not the first stage's, a whole backward): it makes them all before it frees its micro-batch
    making = marks((kind == CODE_W) & (stage != 0)) if cs.split_backward else 0
    grads = ((np.cumsum(free, axis=0) - free + making) > 0).astype(np.int64)
    # the stage output torch holds for the backward goes at the end of B, or of I when split: what a
    # pending W still holds of it is priced per pending W (planner.cost.held.pending_output, in sent_held)
    early = marks((kind == CODE_B) | (kind == CODE_I))
    outputs = np.cumsum(alloc, axis=0) - np.cumsum(early, axis=0) + early
    # pending W: I ended before this action and W did not (during its W a micro-batch still holds them)
    i_end, w_end = marks(kind == CODE_I), marks(kind == CODE_W)
    # each ended I's input gradient, held until the step ends; where sends are held, an ended B is an
    # ended I and an ended W at once (its input gradient and its output stay held)
    held_end = i_end + marks(kind == CODE_B) if sends_held else i_end
    sent = np.cumsum(held_end, axis=0) - held_end
    pending = np.cumsum(i_end, axis=0) - i_end - (np.cumsum(w_end, axis=0) - w_end)
    # i_end: the running I; a running W past the first stage holds fresh weight gradients beyond the
    # stage's only once they exist: the step's first W of a stage assigns its fresh gradients as .grad
    # (torch's stage_backward_weight), a later one adds them in (planner.cost.w_workspace)
    adding = making * ((np.cumsum(free, axis=0) - free) > 0) if cs.split_backward else 0 * i_end
    warm = warmup_send_rows(kind, ids % M, col, n) if warmup_send else 0 * i_end
    rows = np.column_stack([during, bwd_stage, grads, outputs, pending, sent, i_end, adding, warm])
    if cs.split_backward or sends_held:  # after the last action: what the sends hold until the step waits for them
        done = np.concatenate([(alloc - free).sum(axis=0), [-1], free.sum(axis=0) > 0, (alloc - early).sum(axis=0),
                               (i_end - w_end).sum(axis=0), held_end.sum(axis=0), np.zeros(3 * n)]).astype(np.int64)
        rows = np.vstack([rows, done])
    return np.unique(rows, axis=0)


def _build(cs: CompiledSchedule, sends_held: bool, warmup_send: bool = False) -> StateTable:
    width = max(1, max(len(st) for st in cs.rank_stages))
    blocks, starts = [], [0]
    stage_of = np.full((cs.n_ranks, width), -1, dtype=np.int64)
    for r, stages in enumerate(cs.rank_stages):
        n = len(stages)
        stage_of[r, :n] = stages
        got = _rank_states(cs, stages, np.asarray(cs.ids[r], dtype=np.int64), sends_held, warmup_send)
        parts = [got[:, k * n + (k > 0):(k + 1) * n + (k > 0)] for k in range(_GROUPS)]  # skip the bwd column
        pad = [np.pad(p, ((0, 0), (0, width - n))) for p in parts]
        blocks.append(np.column_stack([pad[0], got[:, n], *pad[1:]]))
        starts.append(starts[-1] + len(got))
    rows = np.concatenate(blocks)
    w = width

    def cols(k: int) -> np.ndarray:
        """The k-th group of per-stage columns (0 during, 1 grads, 2 outputs, 3 pending, 4 sent, 5 running, 6 wrun, 7 warm)."""
        first = k * w + (k > 0)
        return np.ascontiguousarray(rows[:, first:first + w])

    start_arr = np.asarray(starts, dtype=np.int64)
    return StateTable(
        rank_stages=cs.rank_stages, stage_of=stage_of, starts=start_arr,
        row_rank=np.repeat(np.arange(cs.n_ranks), np.diff(start_arr)),
        during=cols(0), bwd=np.ascontiguousarray(rows[:, w]), grads=cols(1), outputs=cols(2),
        pending=cols(3), sent=cols(4), running=cols(5), wrun=cols(6), warm=cols(7),
        largest=int(max(1, np.abs(rows).max())),
    )


def state_front(t: StateTable) -> np.ndarray:
    """Ascending rows of `t` that include every row no other row of its rank dominates (pareto_front
    over all its columns); every other row is dominated by one of them. Built on first use and
    cached on the table: only memory_peaks_table prices the front, and the cluster search's moments
    (planner.schedules.memory) read hundreds of tables that are never priced."""
    cached = t.__dict__.get(_FRONT_ATTR)
    if cached is None:
        front = []
        for r in range(len(t.rank_stages)):
            lo, hi = t.starts[r], t.starts[r + 1]
            during, grads, outputs, pending, sent, running, wrun, warm = (x[lo:hi] for x in (t.during, t.grads, t.outputs, t.pending,
                                                                                                t.sent, t.running, t.wrun, t.warm))
            bwd_mark = t.bwd[lo:hi, None] == t.stage_of[r][None, :]
            features = np.column_stack([during, outputs, pending, sent, sent - pending, grads, bwd_mark, running, wrun, warm])
            front.append(lo + pareto_front(features, FRONT_ROUNDS))
        cached = np.concatenate(front)
        object.__setattr__(t, _FRONT_ATTR, cached)  # frozen table, never changed: safe private cache
    return cached


_SMALL_FRONT = 256  # rows up to which pareto_front compares every pair at once (256 x 256 x columns)


def pareto_front(features: np.ndarray, rounds: int | None = None) -> np.ndarray:
    """Ascending indices of the rows of `features` that no other row dominates (is >= in every
    column and differs). Rows must be distinct. A row with the largest column sum among those left
    is never dominated (a dominating row has a larger sum), so take it, drop what it dominates, repeat.

    With `rounds`, stop after that many and keep every row left too: a superset of the front in
    which every dropped row is still dominated by a kept one (enough for the peaks, and bounded
    work where most rows are incomparable, as zero bubble's ended-I counts make them)."""
    f = np.asarray(features, dtype=np.int64)
    if rounds is None and len(f) <= _SMALL_FRONT:  # all pairs at once: one array operation, not one per kept row
        covers = np.all(f[None, :, :] >= f[:, None, :], axis=2)  # covers[i, j]: row j is >= row i everywhere
        np.fill_diagonal(covers, False)
        return np.flatnonzero(~covers.any(axis=1))
    left = np.argsort(-f.sum(axis=1), kind="stable")
    kept = []
    while left.size and (rounds is None or len(kept) < rounds):
        top = left[0]
        kept.append(top)
        rest = left[1:]
        left = rest[~np.all(f[rest] <= f[top], axis=1)]
    return np.sort(np.concatenate([np.asarray(kept, dtype=np.int64), left]))


def _per_column(t: StateTable, values: np.ndarray) -> np.ndarray:
    """(ranks, width) per-stage values laid on the columns, 0.0 in the padding."""
    return np.append(values, 0.0)[t.stage_of]


def _row_sums(t: StateTable, rows: np.ndarray | None, prices: dict[str, np.ndarray], transient: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray]:
    """(activation bytes, gradient bytes) of the given rows (None: all), each summed stage by
    stage and term by term in rank_peak_reference's order, so each is the same float."""
    sel = slice(None) if rows is None else rows
    rank = t.row_rank[sel]
    on = {name: _per_column(t, v)[rank] for name, v in prices.items()}
    during, outputs, pending, sent, grads, running, wrun, warm = (np.asarray(x[sel], dtype=float) for x in
                                                                  (t.during, t.outputs, t.pending, t.sent, t.grads, t.running, t.wrun, t.warm))
    n = len(rank)
    kept, held, wgrad = np.zeros(n), np.zeros(n), np.zeros(n)
    sends, grad = np.zeros(n), np.zeros(n)
    for i in range(t.stage_of.shape[1]):
        kept = kept + during[:, i] * on["kept"][:, i]
        held = held + outputs[:, i] * on["held"][:, i]
        wgrad = wgrad + pending[:, i] * on["wgrad"][:, i] + running[:, i] * on["running"][:, i]  # a running I's wgrads
        if wrun[:, i].any():  # a running W's fresh weight gradients (other plans keep their arithmetic)
            wgrad = wgrad + wrun[:, i] * on["w_work"][:, i]
        sends = sends + (sent[:, i] * on["sent_grad"][:, i] + (sent[:, i] - pending[:, i]) * on["sent_output"][:, i]
                         + pending[:, i] * on["sent_held"][:, i])
        if warm[:, i].any():  # the warm-up's last send's output (other plans keep their arithmetic)
            sends = sends + warm[:, i] * on["warm"][:, i]
        grad = grad + grads[:, i] * on["grad"][:, i]
    act = kept + held + wgrad + sends + np.append(transient, 0.0)[t.bwd[sel]]
    return act, grad


def _first_max(total: np.ndarray, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per group of consecutive rows (`groups` ascending): (its largest total, NaN counted as
    -inf; the first row reaching it; the group id of each row)."""
    clean = np.where(np.isnan(total), -np.inf, total)
    firsts = np.flatnonzero(np.r_[True, groups[1:] != groups[:-1]])
    best = np.maximum.reduceat(clean, firsts)
    ids = np.cumsum(np.r_[False, groups[1:] != groups[:-1]])
    hit = np.flatnonzero(clean == best[ids])
    _, first_hit = np.unique(ids[hit], return_index=True)
    return best, hit[first_hit], ids


def memory_peaks_table(t: StateTable, prices: dict[str, np.ndarray], transient: np.ndarray
                       ) -> list[tuple[float, float]]:
    """rank -> (activation bytes, gradient bytes) of its first state whose sum is the largest
    (planner.schedules.memory.memory_peaks, with its checks done).

    `prices` holds per-stage arrays: kept (kept bytes less the held output), held, wgrad, running, w_work,
    sent_grad, sent_output, sent_held, warm (the stage's output bytes, held by the warm-up's send) and grad. Only the front is priced when every price is a
    whole, finite, non-negative number and every sum stays below 2**52 (a zero-bubble last stage
    whose I frees the loss's tensors has a negative sent_held: its ranks are priced state by
    state): then sums are exact, a
    dominated state's bytes are at most its dominator's, and a state tying the peak has the pair of
    every front state tying it; a rank whose tying front states disagree is priced in full."""
    values = np.concatenate([*prices.values(), transient])
    per_rank = np.zeros(len(t.rank_stages))
    if values.size:
        per_rank = sum(_per_column(t, v).sum(axis=1) for v in (*prices.values(), transient))
    exact = (bool(np.all(np.isfinite(values))) and bool(np.all(values >= 0)) and bool(np.all(values == np.round(values)))
             and float(np.max(per_rank, initial=0.0)) * t.largest * 3 < _EXACT_BOUND)
    rows = state_front(t) if exact else np.arange(len(t.row_rank))
    act, grad = _row_sums(t, rows, prices, transient)
    total = act + grad
    best, first, ids = _first_max(total, t.row_rank[rows])
    out_act, out_grad = act[first], grad[first]
    if exact:
        # ties with another pair: price those ranks' every state (rare; exact sums make it a tie of pairs)
        split = np.unique(ids[(total == best[ids]) & (act != out_act[ids])])
        for r in split:
            lo, hi = t.starts[r], t.starts[r + 1]
            a, g = _row_sums(t, np.arange(lo, hi), prices, transient)
            _, k, _ = _first_max(a + g, np.zeros(hi - lo, dtype=np.int64))
            out_act[r], out_grad[r] = a[k[0]], g[k[0]]
    out: list[tuple[float, float]] = []
    for r, stages in enumerate(t.rank_stages):
        if not stages:  # an empty sum: the scalar definition gives the integer 0 for gradients
            out.append((0.0, 0))
        elif best[r] > -1.0:
            out.append((float(out_act[r]), float(out_grad[r])))
        else:
            out.append((0.0, 0.0))
    return out


def activation_peaks_table(t: StateTable, kept: np.ndarray, transient: np.ndarray) -> list[float]:
    """rank -> the largest sum(in flight x kept) + transient over its states, and at least 0.0."""
    on = _per_column(t, kept)[t.row_rank]
    value = np.zeros(len(t.row_rank))
    during = t.during.astype(float)
    for i in range(t.stage_of.shape[1]):
        value = value + during[:, i] * on[:, i]
    value = value + np.append(transient, 0.0)[t.bwd]
    best, _, _ = _first_max(value, t.row_rank)
    return [float(b) if b > 0.0 else 0.0 for b in best]
