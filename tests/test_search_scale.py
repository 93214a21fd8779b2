"""The memory states of a schedule at scale: the array evaluation (planner.schedules.memory_states)
gives exactly what the plain definition gives, state by state, and the per-schedule caches give
the same values as a fresh computation.

The oracle here walks each rank's actions one by one, keeps the distinct states in sorted order and
prices them with scalar loops (memory_peaks' docstring): the first state with the largest sum wins.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from planner.schedules import check_sizes, generate
from planner.schedules.actions import PipelineSchedule
from planner.schedules.compiled import CODE_B, CODE_F, CODE_I, CODE_W, compile_schedule
from planner.schedules.memory import (
    Moment, activation_peaks, memory_peaks, stage_inflight_peak, stage_memory_moments, undominated,
)
from planner.schedules import memory_states
from planner.schedules.memory_states import pareto_front, state_table
from planner.schedules.registry import holds_sends, holds_warmup_send


def _fresh(schedule: PipelineSchedule) -> PipelineSchedule:
    """An equal schedule object with none of the caches filled."""
    return PipelineSchedule(**{f.name: getattr(schedule, f.name) for f in dataclasses.fields(schedule)})


def _walk_states(schedule: PipelineSchedule) -> list[tuple[tuple[int, ...], list[tuple]]]:
    """rank -> (its stages, sorted distinct (during, bwd, grads, outputs, pending, sent, running I, running W,
    warm-up send)), action by action, and, with a split backward or where the runtime holds its sends
    until the step ends, the state after the rank's last action. Sent: ended I, and ended B where sends
    are held. Warm-up send (1F1B): the class fires each warm-up forward's send but the last and keeps
    the last one it fired until the first backward after the stage's last forward ends."""
    cs = compile_schedule(schedule)
    sends_held = holds_sends(schedule.name, cs.split_backward)
    warmup_send = holds_warmup_send(schedule.name)
    out = []
    for r, stages in enumerate(cs.rank_stages):
        col = {s: i for i, s in enumerate(stages)}
        n = len(stages)
        f_started, last_ended, first_ended = [0] * n, [0] * n, [0] * n
        i_ended, w_ended, b_ended = [0] * n, [0] * n, [0] * n
        # per stage: micro-batches of its forwards so far, the one whose send the class keeps, and
        # whether only that send holds its output now
        forwards, kept_send, warm = [[] for _ in range(n)], [None] * n, [0] * n
        total_f = [sum(1 for a in cs.ids[r] if cs.split_id(a)[:2] == (CODE_F, s)) for s in stages]
        seen = set()

        def state(bwd: int, making: int = -1) -> tuple:
            during = tuple(f_started[k] - last_ended[k] for k in range(n))
            grads = tuple(int(last_ended[k] > 0 or k == making) for k in range(n))
            outputs = tuple(f_started[k] - first_ended[k] for k in range(n))
            pending = tuple(i_ended[k] - w_ended[k] for k in range(n))
            sent = tuple(i_ended[k] + (b_ended[k] if sends_held else 0) for k in range(n))
            return during + (bwd,) + grads + outputs + pending + sent

        for a in cs.ids[r]:
            kind, s, _ = cs.split_id(a)
            i = col[s]
            if kind == CODE_F:
                f_started[i] += 1
            # the transient: B or I, but W on the first stage, whose I computes no input gradient
            bwd = s if kind == CODE_B or (kind == CODE_I and s > 0) or (kind == CODE_W and s == 0) else -1
            running = tuple(int(kind == CODE_I and k == i) for k in range(n))
            # a split W (not the first stage's whole backward) makes every gradient before freeing anything,
            # and, once the gradients exist (a W of the stage ended before), holds its fresh ones while it runs
            split_w = kind == CODE_W and s > 0 and cs.split_backward
            running_w = tuple(int(split_w and k == i and last_ended[k] > 0) for k in range(n))
            seen.add(state(bwd, i if split_w else -1) + running + running_w + tuple(warm))
            if kind == CODE_B or kind == CODE_W:  # the micro-batch's last backward action frees it
                last_ended[i] += 1
            if kind in (CODE_B, CODE_I):
                first_ended[i] += 1
            if kind == CODE_I:
                i_ended[i] += 1
            if kind == CODE_W:
                w_ended[i] += 1
            if kind == CODE_B:
                b_ended[i] += 1
            mb = cs.split_id(a)[2]
            if warmup_send and kind == CODE_F and b_ended[i] == 0:
                forwards[i].append(mb)
            elif warmup_send and kind == CODE_B:
                if b_ended[i] == 1 and len(forwards[i]) >= 2:  # the warm-up is over: its last fired send is kept
                    kept_send[i] = forwards[i][-2]
                loop_ends = f_started[i] == total_f[i]  # the first B after the last F ends the steady loop
                if loop_ends or (warm[i] == 0 and kept_send[i] == mb):  # released, or only the send holds it now
                    warm[i] = 0 if loop_ends else 1
                    kept_send[i] = None if loop_ends else kept_send[i]
        if not seen:
            seen.add((0,) * n + (-1,) + (0,) * (7 * n))
        elif cs.split_backward or sends_held:  # the sends hold what they sent until the step waits for them
            seen.add(state(-1) + (0,) * (3 * n))
        rows = sorted(seen)
        out.append((stages, [(u[:n], u[n], u[n + 1:2 * n + 1], u[2 * n + 1:3 * n + 1], u[3 * n + 1:4 * n + 1],
                              u[4 * n + 1:5 * n + 1], u[5 * n + 1:6 * n + 1], u[6 * n + 1:7 * n + 1], u[7 * n + 1:])
                             for u in rows]))
    return out


def _plain_peaks(schedule, kept_bytes, transient_bytes, gradient_bytes, output_bytes, wgrad_bytes, sent_bytes,
                 running_bytes=None, w_work_bytes=None, warm_bytes=None):
    out = []
    for stages, states in _walk_states(schedule):
        held = [float(output_bytes[s]) if output_bytes is not None else 0.0 for s in stages]
        kept = [float(kept_bytes[s]) - h for s, h in zip(stages, held)]
        grad = [float(gradient_bytes[s]) for s in stages]
        wgrad = [float(wgrad_bytes[s]) if wgrad_bytes is not None else 0.0 for s in stages]
        run = [float(running_bytes[s]) if running_bytes is not None else 0.0 for s in stages]
        w_work = [float(w_work_bytes[s]) if w_work_bytes is not None else 0.0 for s in stages]
        sends = [tuple(float(x) for x in sent_bytes[s]) if sent_bytes is not None else (0.0, 0.0, 0.0) for s in stages]
        warm_out = [float(warm_bytes[s]) if warm_bytes is not None else 0.0 for s in stages]
        best, at = -1.0, (0.0, 0.0)
        for counts, bwd, has_grad, outs, pending, sent, running, running_w, warm in states:
            act = (sum(c * k for c, k in zip(counts, kept)) + sum(c * h for c, h in zip(outs, held))
                   + sum(c * w + x * r + (y * v if y else 0.0) for c, x, y, w, r, v in zip(pending, running, running_w, wgrad, run, w_work))
                   + sum(i * x[0] + (i - p) * x[1] + p * x[2] + (h * o if h else 0.0)
                         for i, p, x, h, o in zip(sent, pending, sends, warm, warm_out))
                   + (float(transient_bytes[bwd]) if bwd >= 0 else 0.0))
            g = sum(h * x for h, x in zip(has_grad, grad))
            if act + g > best:
                best, at = act + g, (act, g)
        out.append(at)
    return out


def _plain_activation_peaks(schedule, kept_bytes, transient_bytes):
    peaks = []
    for stages, states in _walk_states(schedule):
        best = 0.0
        for counts, bwd, *_ in states:
            value = sum(c * float(kept_bytes[s]) for c, s in zip(counts, stages))
            if bwd >= 0:
                value += float(transient_bytes[bwd])
            best = max(best, value)
        peaks.append(best)
    return peaks


def _plain_moments(schedule):
    seen = [set() for _ in range(schedule.n_stages)]
    for stages, states in _walk_states(schedule):
        for i, s in enumerate(stages):
            for counts, bwd, has_grad, _, pending, sent, running, running_w, warm in states:
                seen[s].add((counts[i], bwd == s, bool(has_grad[i]), pending[i], sent[i], bool(running[i]), bool(running_w[i]),
                             bool(warm[i])))
    out = []
    for moments in seen:
        kept = [m for m in moments if not any(o != m and all(a >= b for a, b in zip(o, m)) and o[4] - o[3] >= m[4] - m[3]
                                              and o[0] - o[3] >= m[0] - m[3] for o in moments)]
        out.append(sorted(kept, key=lambda m: (m[2], m[1], m[0], m[3], m[4], m[5], m[6], m[7])))
    return out


def _random_schedules(rng, count):
    out = []
    while len(out) < count:
        name = str(rng.choice(["gpipe", "1f1b", "interleaved", "zb"]))
        v = 2 if name == "interleaved" else 1
        ranks, m = int(rng.integers(1, 6)), int(rng.integers(1, 11))
        try:
            check_sizes(name, ranks, m, v)
        except Exception:
            continue
        out.append(generate(name, ranks, m, v))
    return out


def _prices(rng, kind: str, n: int) -> list[float]:
    if kind == "small":  # whole numbers with many ties: the exact path and its tie check
        return rng.integers(0, 4, n).astype(float).tolist()
    if kind == "bytes":
        return np.round(rng.uniform(0, 1e9, n)).tolist()
    if kind == "fraction":  # not whole: every state is priced
        return rng.uniform(0, 10, n).tolist()
    return rng.choice([0.0, 0.1, 1.0, 3.0, 1e16], n).tolist()  # sums beyond exact float integers


@pytest.mark.parametrize("kind", ["small", "bytes", "fraction", "huge"])
def test_memory_peaks_equal_the_plain_definition(kind):
    rng = np.random.default_rng(["small", "bytes", "fraction", "huge"].index(kind))
    for schedule in _random_schedules(rng, 120 if kind == "fraction" else 40):
        S = schedule.n_stages
        kept, trans, grad = (_prices(rng, kind, S) for _ in range(3))
        held = [min(h, k) for h, k in zip(_prices(rng, kind, S), kept)] if rng.random() < 0.7 else None
        wgrad = _prices(rng, kind, S) if rng.random() < 0.5 else None
        sent = [tuple(_prices(rng, kind, 3)) for _ in range(S)] if rng.random() < 0.5 else None
        running = _prices(rng, kind, S) if rng.random() < 0.5 else None
        w_work = _prices(rng, kind, S) if rng.random() < 0.5 else None
        warm = _prices(rng, kind, S) if rng.random() < 0.7 else None
        want = _plain_peaks(schedule, kept, trans, grad, held, wgrad, sent, running, w_work, warm)
        got = memory_peaks(_fresh(schedule), kept, trans, grad, held, wgrad, sent, running, w_work, warm)
        assert repr(got) == repr(want), (schedule.name, schedule.n_ranks, schedule.n_microbatches, kind)
        assert repr(activation_peaks(schedule, kept, trans)) == repr(_plain_activation_peaks(schedule, kept, trans))


def test_a_front_cut_short_gives_the_same_peaks(monkeypatch):
    monkeypatch.setattr(memory_states, "FRONT_ROUNDS", 1)  # keeps most rows: dominated ones among the front
    rng = np.random.default_rng(21)
    for schedule in _random_schedules(rng, 40):
        S = schedule.n_stages
        kept, trans, grad, held, wgrad, running, w_work, warm = (_prices(rng, "small", S) for _ in range(8))
        held = [min(h, k) for h, k in zip(held, kept)]
        sent = [tuple(_prices(rng, "small", 3)) for _ in range(S)]
        want = _plain_peaks(schedule, kept, trans, grad, held, wgrad, sent, running, w_work, warm)
        assert repr(memory_peaks(_fresh(schedule), kept, trans, grad, held, wgrad, sent, running, w_work, warm)) == repr(want)


def test_a_tie_the_front_alone_would_break_otherwise_takes_the_first_state():
    # rank 2 reaches 4 bytes as (4, 0) in a state the front drops and as (3, 1) in a front state
    # that comes first among the front: the rank is priced state by state
    sched = generate("zb", 4, 4)
    kept, trans, grad, held = [1.0, 2.0, 1.0, 1.0], [0.0, 2.0, 2.0, 3.0], [0.0, 3.0, 1.0, 3.0], [1.0, 2.0, 1.0, 0.0]
    want = _plain_peaks(sched, kept, trans, grad, held, None, None)
    assert want[2] == (4.0, 0.0)
    assert memory_peaks(_fresh(sched), kept, trans, grad, held) == want


def test_a_tie_between_different_pairs_takes_the_first_state():
    # GPipe stage: 4 micro-batches and no gradients, or 3 and gradients: both sum to 4
    sched = generate("gpipe", 2, 4)
    want = _plain_peaks(sched, [1.0, 1.0], [0.0, 0.0], [1.0, 1.0], None, None, None)
    assert memory_peaks(_fresh(sched), [1.0, 1.0], [0.0, 0.0], [1.0, 1.0]) == want == [(3.0, 1.0), (3.0, 1.0)]


def test_a_rank_without_stages_holds_nothing():
    one = generate("1f1b", 1, 2)
    sched = PipelineSchedule("custom", 2, 1, 2, (0,), {0: one.order[0], 1: ()})
    want = _plain_peaks(sched, [4.0], [1.0], [2.0], None, None, None)
    assert repr(memory_peaks(sched, [4.0], [1.0], [2.0])) == repr(want) == repr([(5.0, 2.0), (0.0, 0)])
    assert activation_peaks(sched, [4.0], [1.0]) == [5.0, 0.0]


def test_moments_and_inflight_equal_the_plain_definition():
    rng = np.random.default_rng(7)
    for schedule in _random_schedules(rng, 40):
        got = [[dataclasses.astuple(m) for m in stage] for stage in stage_memory_moments(_fresh(schedule))]
        assert got == [[tuple(m) for m in stage] for stage in _plain_moments(schedule)], (schedule.name, schedule.n_ranks)
        assert stage_inflight_peak(_fresh(schedule)) == [max(st[0][stages.index(s)] for st in states)
                                                         for s in range(schedule.n_stages)
                                                         for stages, states in _walk_states(schedule) if s in stages]


def test_state_table_rows_are_the_walked_states_in_order():
    rng = np.random.default_rng(3)
    for schedule in _random_schedules(rng, 20):
        t = state_table(_fresh(schedule))
        for r, (stages, states) in enumerate(_walk_states(schedule)):
            n, lo, hi = len(stages), t.starts[r], t.starts[r + 1]
            rows = [(tuple(t.during[k, :n].tolist()), int(t.bwd[k]), tuple(t.grads[k, :n].tolist()),
                     tuple(t.outputs[k, :n].tolist()), tuple(t.pending[k, :n].tolist()), tuple(t.sent[k, :n].tolist()),
                     tuple(t.running[k, :n].tolist()), tuple(t.wrun[k, :n].tolist()), tuple(t.warm[k, :n].tolist()))
                    for k in range(lo, hi)]
            assert rows == states


def test_pareto_front_keeps_exactly_the_undominated_rows():
    # up to 256 rows every pair is compared at once, above that row by row: both paths
    rng = np.random.default_rng(11)
    for case in range(60):
        n, top = (int(rng.integers(1, 40)), 4) if case < 50 else (int(rng.integers(257, 600)), 9)
        rows = np.unique(rng.integers(0, top, (n, int(rng.integers(1, 5)))), axis=0)
        want = [i for i, a in enumerate(rows) if not any(np.all(b >= a) and np.any(b != a) for b in rows)]
        assert pareto_front(rows).tolist() == want


def test_undominated_keeps_exactly_the_moments_no_other_covers():
    """By the definition, against every pair: a moment is covered by another with as many or more of
    each count and flag, of ended W (sent - pending) and of held outputs (in flight - pending). Random
    moments with many alike but for in_flight or sent_grads, which undominated cuts before the front."""
    rng = np.random.default_rng(13)

    def features(m: Moment) -> tuple[int, ...]:
        c, x, p = m.in_flight, m.sent_grads, m.pending_w
        return (c, int(m.transient), int(m.gradients), p, x, int(m.running_i), int(m.running_w), int(m.warmup_send), x - p, c - p)

    for _ in range(80):
        moments = [Moment(int(c), bool(t), bool(g), int(p), int(x), bool(i), bool(w), bool(h))
                   for c, t, g, p, x, i, w, h in rng.integers(0, [6, 2, 2, 3, 6, 2, 2, 2], (int(rng.integers(0, 80)), 8))]
        distinct = set(moments)
        want = {a for a in distinct
                if not any(b != a and all(u >= v for u, v in zip(features(b), features(a))) for b in distinct)}
        got = undominated(moments)
        assert set(got) == want and len(got) == len(want)
        assert list(got) == sorted(got, key=lambda m: (m.gradients, m.transient, m.in_flight, m.pending_w, m.sent_grads,
                                                      m.running_i, m.running_w, m.warmup_send))


def test_pareto_front_with_few_rounds_keeps_a_dominating_superset():
    rng = np.random.default_rng(12)
    for _ in range(50):
        rows = np.unique(rng.integers(0, 6, (int(rng.integers(1, 60)), 3)), axis=0)
        kept = pareto_front(rows, rounds=2).tolist()
        assert set(pareto_front(rows).tolist()) <= set(kept) and kept == sorted(kept)
        for i in set(range(len(rows))) - set(kept):
            assert any(np.all(rows[k] >= rows[i]) for k in kept)


def test_caches_return_the_same_values_as_a_fresh_computation():
    sched = generate("zb", 4, 8)
    first_moments, first_peak = stage_memory_moments(sched), stage_inflight_peak(sched)
    first_moments.append(())  # a caller's change to the returned list does not reach the cache
    first_peak[0] = -1
    assert stage_memory_moments(sched) == stage_memory_moments(_fresh(sched))
    assert stage_inflight_peak(sched) == stage_inflight_peak(_fresh(sched))
    assert state_table(sched) is state_table(sched)
    kept = [3.0, 1.0, 2.0, 5.0]
    assert memory_peaks(sched, kept, kept, kept) == memory_peaks(sched, kept, kept, kept) == memory_peaks(_fresh(sched), kept, kept, kept)

