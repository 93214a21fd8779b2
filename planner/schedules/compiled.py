"""A schedule flattened to integer arrays, and the one dependency-respecting sweep over it.

The validator (unit-time dry run), the spacing of generated orders, the memory model and the
simulator all walk a schedule the same way, so they share this module. Actions are numbered

    key = kind_code * n_stages + stage        (kind_code = ActionKind.code: F=0, B=1, I=2, W=3)
    id  = key * n_microbatches + microbatch   (`action_id`, the one place this is written)

so per-(stage, kind) tables are plain lists indexed by `key` and per-action state by `id`.
Compiling a schedule costs one pass over its actions; the result is cached on the schedule
object (it is immutable), because the partitioner simulates the same schedule thousands of times.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from planner.errors import ScheduleError
from planner.schedules.actions import KINDS, N_KINDS, Action, ActionKind, PipelineSchedule, format_order, parse_action

__all__ = [
    "KIND_CODE", "CODE_F", "CODE_B", "CODE_I", "CODE_W", "N_KINDS",
    "CompiledSchedule", "SweepResult", "action_id", "compile_schedule", "share_compiled", "sweep",
]

KIND_CODE = {k: k.code for k in ActionKind}  # ActionKind (or its letter) -> code
# Codes of the kinds, for the integer tables and numpy masks of the compiled schedule.
CODE_F, CODE_B, CODE_I, CODE_W = (ActionKind.FORWARD.code, ActionKind.FULL_BACKWARD.code,
                                  ActionKind.BACKWARD_INPUT.code, ActionKind.BACKWARD_WEIGHT.code)
_F, _B, _I, _W = CODE_F, CODE_B, CODE_I, CODE_W


def action_id(kind_code: int, stage: int, microbatch: int, n_stages: int, n_microbatches: int) -> int:
    """The integer id of an action (module docstring); `CompiledSchedule.split_id` inverts it."""
    return (kind_code * n_stages + stage) * n_microbatches + microbatch
_CACHE_ATTR = "_pplan_compiled"


@dataclass(frozen=True)
class CompiledSchedule:
    """Structure of a validated schedule as flat integer lists (no idle slots)."""

    n_ranks: int
    """Ranks (devices) of the pipeline."""
    n_stages: int
    """Stages."""
    n_microbatches: int
    """Micro-batches per iteration."""
    stage_rank: tuple[int, ...]
    """stage -> rank."""
    ids: tuple[tuple[int, ...], ...]
    """rank -> action ids in execution order."""
    deps: tuple[tuple[int, ...], ...]
    """rank -> id of the action on another stage whose output each action waits for (-1: none)."""
    positions: tuple[tuple[int, ...], ...]
    """rank -> index of each action in the schedule's order (with idle slots), for messages."""
    split_backward: bool
    """True when some backward is split into I and W."""
    key_counts: tuple[int, ...]
    """key (kind * n_stages + stage) -> how many actions of that stage and kind there are."""
    rank_stages: tuple[tuple[int, ...], ...]
    """rank -> its stages, ascending."""
    rank_keys: tuple[tuple[tuple[int, int], ...], ...]
    """rank -> (key, count) for each kind of action it runs (busy time = sum count x duration)."""

    @property
    def n_keys(self) -> int:
        """Length of the per-(kind, stage) tables: one entry per key."""
        return N_KINDS * self.n_stages

    @property
    def n_ids(self) -> int:
        """Length of the per-action tables: one entry per possible action id."""
        return self.n_keys * self.n_microbatches

    def id_of(self, action: Action) -> int:
        """The id of `action` in this schedule."""
        return action_id(KIND_CODE[action.kind], action.stage, action.microbatch, self.n_stages, self.n_microbatches)

    def split_id(self, aid: int) -> tuple[int, int, int]:
        """(kind code, stage, micro-batch) of an action id."""
        key, mb = divmod(aid, self.n_microbatches)
        kind, stage = divmod(key, self.n_stages)
        return kind, stage, mb

    def describe(self, action_id: int) -> str:
        """`'2F5'` for an action id."""
        kind, stage, mb = self.split_id(action_id)
        return f"{stage}{KINDS[kind]}{mb}"


@dataclass(frozen=True)
class SweepResult:
    """Start and end time of every action id (-1.0 where the id is not in the schedule)."""

    start: list[float]
    """id -> start time."""
    end: list[float]
    """id -> end time."""
    send_start: list[float]
    """id -> when its output starts crossing a link (-1.0 when it crosses none)."""
    ready: list[float]
    """id -> when its output is available to the consuming stage."""
    device_end: list[float]
    """rank -> end of its last action."""
    rank_visits: list[int]
    """rank -> how many times the sweep resumed it (waking only a rank whose input is ready keeps
    this to a few per rank; a pass over every rank per step would make it ranks x ranks)."""


def compile_schedule(schedule: PipelineSchedule) -> CompiledSchedule:
    """Check the schedule's structure and flatten it (cached on the object).

    Raises ScheduleError when an action is malformed, on the wrong rank, missing, duplicated
    or out of order on its rank (F before B/I, I before W). Deadlocks are found by `sweep`.
    """
    cached = schedule.__dict__.get(_CACHE_ATTR)
    if cached is not None:
        return cached
    compiled = _compile(schedule)
    # The schedule is frozen and never changes, so a private cache on it is safe.
    object.__setattr__(schedule, _CACHE_ATTR, compiled)
    return compiled


def share_compiled(source: PipelineSchedule, target: PipelineSchedule) -> None:
    """Give `target` the compiled form of `source`: for a schedule with the same actions in the same
    per-rank order (only its idle slots differ), which compiles to the same structure."""
    object.__setattr__(target, _CACHE_ATTR, compile_schedule(source))


def _compile(sch: PipelineSchedule) -> CompiledSchedule:
    S, M, R = sch.n_stages, sch.n_microbatches, sch.n_ranks
    _check_sizes(sch)
    ids_r, pos_r, pos = _flatten_orders(sch)
    bwd_kind, split = _backward_kinds(sch, pos)
    key_counts = [0] * (N_KINDS * S)
    for ids in ids_r:
        for aid in ids:
            key_counts[aid // M] += 1
    rank_stages = tuple(tuple(s for s in range(S) if sch.stage_rank[s] == r) for r in range(R))
    rank_keys = tuple(
        tuple((k * S + s, key_counts[k * S + s]) for s in rank_stages[r] for k in range(N_KINDS) if key_counts[k * S + s])
        for r in range(R)
    )
    return CompiledSchedule(
        n_ranks=R, n_stages=S, n_microbatches=M, stage_rank=tuple(sch.stage_rank),
        ids=tuple(tuple(x) for x in ids_r), deps=tuple(_dependencies(ids, bwd_kind, S, M) for ids in ids_r),
        positions=tuple(tuple(x) for x in pos_r), split_backward=split,
        key_counts=tuple(key_counts), rank_stages=rank_stages, rank_keys=rank_keys,
    )


def _check_sizes(sch: PipelineSchedule) -> None:
    """ScheduleError unless the counts are positive, every stage has a rank and `order` every rank."""
    S, M, R = sch.n_stages, sch.n_microbatches, sch.n_ranks
    if R < 1 or S < 1 or M < 1:
        raise ScheduleError(f"schedule {sch.name!r} has {R} ranks, {S} stages, {M} micro-batches", "all must be at least 1")
    if len(sch.stage_rank) != S or any(not 0 <= r < R for r in sch.stage_rank):
        raise ScheduleError(f"schedule {sch.name!r}: stage_rank {list(sch.stage_rank)[:16]} must give a rank in 0..{R - 1} for each of {S} stages")
    if sorted(sch.order) != list(range(R)):
        raise ScheduleError(f"schedule {sch.name!r}: order has ranks {sorted(sch.order)[:16]}, expected 0..{R - 1}")


def _flatten_orders(sch: PipelineSchedule) -> tuple[list[list[int]], list[list[int]], list[int]]:
    """(rank -> action ids in order, rank -> their steps in the order with idle slots, id -> index
    in its rank's list or -1). ScheduleError on a malformed, misplaced or repeated action."""
    S, M, R = sch.n_stages, sch.n_microbatches, sch.n_ranks
    pos = [-1] * (N_KINDS * S * M)
    ids_r, pos_r = [], []
    for rank in range(R):
        ids: list[int] = []
        where: list[int] = []
        for step, a in enumerate(sch.order[rank]):
            if a is None:
                continue
            if not isinstance(a, Action):
                a = parse_action(str(a))
            kind = KIND_CODE.get(a.kind)
            s, m = a.stage, a.microbatch
            if kind is None or not (0 <= s < S and 0 <= m < M):
                raise ScheduleError(f"schedule {sch.name!r}: action {a} on rank {rank} step {step} is outside {S} stages x {M} micro-batches")
            if sch.stage_rank[s] != rank:
                raise ScheduleError(f"schedule {sch.name!r}: action {a} is on rank {rank} but stage {s} belongs to rank {sch.stage_rank[s]}")
            aid = action_id(kind, s, m, S, M)
            if pos[aid] >= 0:
                raise ScheduleError(f"schedule {sch.name!r}: action {a} appears twice (rank {rank} step {step})")
            pos[aid] = len(ids)
            ids.append(aid)
            where.append(step)
        ids_r.append(ids)
        pos_r.append(where)
    return ids_r, pos_r, pos


def _backward_kinds(sch: PipelineSchedule, pos: list[int]) -> tuple[list[int], bool]:
    """((stage, mb) -> code of its input-gradient action (B or I), whether any backward is split).
    ScheduleError unless every (stage, mb) has one F and then one B, or F, I, W in that order."""
    S, M = sch.n_stages, sch.n_microbatches
    split = False
    bwd_kind = [0] * (S * M)
    for s in range(S):
        for m in range(M):
            f, b, i, w = (action_id(k, s, m, S, M) for k in (_F, _B, _I, _W))
            name = f"stage {s} micro-batch {m}"
            if pos[f] < 0:
                raise ScheduleError(f"schedule {sch.name!r}: {name} has no forward ({s}F{m})", "every micro-batch needs one F per stage")
            if pos[b] >= 0:
                if pos[i] >= 0 or pos[w] >= 0:
                    raise ScheduleError(f"schedule {sch.name!r}: {name} has both a full backward and a split one (I/W)")
                if pos[b] < pos[f]:
                    raise ScheduleError(f"schedule {sch.name!r}: {s}B{m} runs before {s}F{m} on rank {sch.stage_rank[s]}")
                bwd_kind[s * M + m] = _B
            else:
                if pos[i] < 0 or pos[w] < 0:
                    raise ScheduleError(f"schedule {sch.name!r}: {name} has no backward", "give it one B, or one I and one W")
                if not pos[f] < pos[i] < pos[w]:
                    raise ScheduleError(f"schedule {sch.name!r}: {name} must run F, then I, then W on rank {sch.stage_rank[s]}")
                bwd_kind[s * M + m] = _I
                split = True
    return bwd_kind, split


def _dependencies(ids: list[int], bwd_kind: list[int], S: int, M: int) -> tuple[int, ...]:
    """For each of a rank's actions, the id of the action on another stage whose output it waits
    for (-1: none): F waits for the previous stage's F, B or I for the next stage's B or I."""
    deps = []
    for aid in ids:
        key, m = divmod(aid, M)
        kind, s = divmod(key, S)
        if kind == _F:
            deps.append(action_id(_F, s - 1, m, S, M) if s > 0 else -1)
        elif kind == _W or s == S - 1:
            deps.append(-1)  # local inputs only: the order check in _backward_kinds guarantees them
        else:
            deps.append(action_id(bwd_kind[(s + 1) * M + m], s + 1, m, S, M))
    return tuple(deps)


def sweep(
    cs: CompiledSchedule,
    dur: Sequence[float],
    send_ms: Sequence[float],
    link: Sequence[int],
    n_links: int,
    order: dict | None = None,
) -> SweepResult:
    """Run every rank's actions in order as early as their inputs allow.

    `dur`, `send_ms` and `link` are indexed by key (kind * n_stages + stage): compute time,
    transfer time of the action's output, and the directed link it crosses (-1: none).
    A link serialises its transfers first-in first-out; every transfer on a link is issued by
    the one device at its sending end, in that device's order, so FIFO order is known without
    a global event queue. Raises ScheduleError with the rank x step grid on deadlock.
    """
    n_ids = cs.n_ids
    # Filled in place by _advance; device_end doubles as each rank's "free from" time.
    out = SweepResult(start=[-1.0] * n_ids, end=[-1.0] * n_ids, send_start=[-1.0] * n_ids, ready=[-1.0] * n_ids,
                      device_end=[0.0] * cs.n_ranks, rank_visits=[0] * cs.n_ranks)
    link_free = [0.0] * max(n_links, 1)
    ptr = [0] * cs.n_ranks
    # A rank that stops waits for one action, and each output feeds one action: the rank is woken
    # when that action ends instead of every rank being revisited per pass (S passes of S ranks
    # for GPipe's backward). Times do not depend on the visiting order: an action starts when its
    # rank is free and its input is ready, and each link carries one rank's sends in its order.
    waiting: dict[int, int] = {}
    todo = list(range(cs.n_ranks - 1, -1, -1))
    ran = 0
    while todo:
        r = todo.pop()
        out.rank_visits[r] += 1
        ran += _advance(cs, r, ptr, dur, send_ms, link, link_free, out, waiting, todo)
    if ran != sum(len(x) for x in cs.ids):
        _raise_deadlock(cs, ptr, order)
    return out


def _advance(cs: CompiledSchedule, r: int, ptr: list[int], dur: Sequence[float], send_ms: Sequence[float],
             link: Sequence[int], link_free: list[float], out: SweepResult, waiting: dict[int, int],
             todo: list[int]) -> int:
    """Run rank r's actions from `ptr[r]` until one waits for an input not produced yet (then
    r waits in `waiting` for it). Writes the actions' times into `out`, moves `ptr` and the
    links' next free times (`link_free`), queues in `todo` the ranks its actions release;
    returns how many actions ran."""
    M = cs.n_microbatches
    start, end, send_start, ready, free = out.start, out.end, out.send_start, out.ready, out.device_end
    p = p0 = ptr[r]
    ids = cs.ids[r]
    deps = cs.deps[r]
    n = len(ids)
    t = free[r]
    while p < n:
        d = deps[p]
        if d >= 0:
            rd = ready[d]
            if rd < 0.0:
                waiting[d] = r
                break
            if rd > t:
                t = rd
        a = ids[p]
        key = a // M
        start[a] = t
        t += dur[key]
        end[a] = t
        ln = link[key]
        if ln >= 0:
            s0 = link_free[ln]
            if t > s0:
                s0 = t
            send_start[a] = s0
            s0 += send_ms[key]
            link_free[ln] = s0
            ready[a] = s0
        else:
            ready[a] = t
        if a in waiting:
            todo.append(waiting.pop(a))
        p += 1
    ptr[r] = p
    free[r] = t
    return p - p0


def _raise_deadlock(cs: CompiledSchedule, ptr: list[int], order: dict | None) -> None:
    stuck = [r for r in range(cs.n_ranks) if ptr[r] < len(cs.ids[r])]
    r = stuck[0]
    a = cs.ids[r][ptr[r]]
    waits = cs.describe(cs.deps[r][ptr[r]])
    summary = (f"schedule deadlocks: rank {r} waits at step {cs.positions[r][ptr[r]]} to run "
               f"{cs.describe(a)}, which waits for {waits}, but no rank can get to {waits} "
               f"({len(stuck)} of {cs.n_ranks} ranks stuck)")
    grid = format_order(order, mark=(r, cs.positions[r][ptr[r]])) if order is not None else ""
    err = ScheduleError(summary, "reorder the ranks' actions so every input is produced before it is needed")
    # The grid is the one multi-line message pplan allows: it shows where the ranks wait.
    if grid:
        err.args = (err.one_line() + "\n" + grid,)
    raise err
