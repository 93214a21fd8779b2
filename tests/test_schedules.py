"""Schedule generators, size checks, the validator and schedule memory (no torch here)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.errors import ScheduleError
from planner.schedules import (
    SCHEDULE_NAMES, Action, PipelineSchedule, check_sizes, from_csv_rows, generate,
    parse_action, valid_microbatches, validate,
)
from planner.schedules.memory import rank_activation_peak, stage_inflight_peak


def _row(schedule: PipelineSchedule, rank: int) -> list[str | None]:
    return [None if a is None else str(a) for a in schedule.order[rank]]


def test_gpipe_literal() -> None:
    s = generate("gpipe", 2, 3)
    assert _row(s, 0) == ["0F0", "0F1", "0F2", None, None, "0B0", "0B1", "0B2"]
    assert _row(s, 1) == [None, "1F0", "1F1", "1F2", "1B0", "1B1", "1B2"]


def test_1f1b_literal() -> None:
    s = generate("1f1b", 3, 4)
    assert [str(a) for a in s.actions(0)] == ["0F0", "0F1", "0F2", "0B0", "0F3", "0B1", "0B2", "0B3"]
    assert [str(a) for a in s.actions(2)] == ["2F0", "2B0", "2F1", "2B1", "2F2", "2B2", "2F3", "2B3"]
    # unit-step layout: rank 0 waits two steps for the first gradient to come back
    assert _row(s, 0)[:6] == ["0F0", "0F1", "0F2", None, None, "0B0"]


def test_interleaved_literal() -> None:
    s = generate("interleaved", 2, 4, 2)
    assert s.stage_rank == (0, 1, 0, 1)
    assert [str(a) for a in s.actions(0)] == [
        "0F0", "0F1", "2F0", "2F1", "0F2", "2B0", "0F3", "2B1", "2F2", "0B0", "2F3", "0B1",
        "2B2", "2B3", "0B2", "0B3"]


def test_zb_literal() -> None:
    s = generate("zb", 3, 4)
    assert [str(a) for a in s.actions(0)] == [
        "0F0", "0F1", "0F2", "0I0", "0W0", "0F3", "0I1", "0W1", "0I2", "0W2", "0I3", "0W3"]
    assert [str(a) for a in s.actions(2)] == [
        "2F0", "2I0", "2F1", "2I1", "2F2", "2I2", "2W0", "2F3", "2I3", "2W1", "2W2", "2W3"]
    assert s.split_backward


@pytest.mark.parametrize(("name", "P", "M", "v", "needle"), [
    ("nope", 2, 2, 1, "unknown schedule"),
    ("1f1b", 4, 3, 1, "M=3 < P=4"),
    ("interleaved", 4, 8, 1, "at least 2 stages per rank"),
    ("gpipe", 4, 8, 2, "one stage per rank"),
    ("interleaved", 4, 9, 2, "use 8 or 10 micro-batches"),
    ("zb", 2, 7, 1, "use 6 or 8 micro-batches"),
    ("gpipe", 0, 4, 1, "ranks must be a positive integer"),
])
def test_check_sizes_rejects(name: str, P: int, M: int, v: int, needle: str) -> None:
    with pytest.raises(ScheduleError) as exc:
        generate(name, P, M, v)
    assert needle in str(exc.value)
    assert "\n" not in str(exc.value)


def test_check_sizes_follows_torch_rounds() -> None:
    # torch 2.13: rounds = max(1, M // P), M % rounds == 0
    assert [m for m in range(1, 17) if valid_microbatches("interleaved", 4, m)] == [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 15, 16]
    check_sizes("interleaved", 4, 10, 2)
    check_sizes("gpipe", 8, 1)


def _sched(rows: dict[int, list[str | None]], M: int, name: str = "custom") -> PipelineSchedule:
    order = {r: tuple(None if a is None else parse_action(a) for a in row) for r, row in rows.items()}
    n_stages = 1 + max(a.stage for row in order.values() for a in row if a is not None)
    return PipelineSchedule(name=name, n_ranks=len(rows), n_stages=n_stages, n_microbatches=M,
                            stage_rank=tuple(s % len(rows) for s in range(n_stages)), order=order)


def test_validator_finds_missing_duplicate_and_misordered() -> None:
    with pytest.raises(ScheduleError, match="has no backward"):
        validate(_sched({0: ["0F0", "0F1", "0B0"], 1: ["1F0", "1B0", "1F1", "1B1"]}, 2))
    with pytest.raises(ScheduleError, match="appears twice"):
        validate(_sched({0: ["0F0", "0F0", "0B0"], 1: ["1F0", "1B0"]}, 1))
    with pytest.raises(ScheduleError, match="runs before"):
        validate(_sched({0: ["0B0", "0F0"], 1: ["1F0", "1B0"]}, 1))
    with pytest.raises(ScheduleError, match="belongs to rank 1"):
        validate(_sched({0: ["0F0", "1F0", "0B0"], 1: ["1B0"]}, 1))
    with pytest.raises(ScheduleError, match="F, then I, then W"):
        validate(_sched({0: ["0F0", "0W0", "0I0"]}, 1))


def test_validator_reports_deadlock_with_marked_grid() -> None:
    # rank 0 waits in 0B0 for 1B0; rank 1 first runs 1F1, which needs 0F1, queued after 0B0
    s = _sched({0: ["0F0", "0B0", "0F1", "0B1"], 1: ["1F1", "1B1", "1F0", "1B0"]}, 2)
    with pytest.raises(ScheduleError) as exc:
        validate(s)
    text = str(exc.value)
    first, *grid = text.splitlines()
    assert first.startswith("schedule deadlocks: rank 0 waits at step 1 to run 0B0, which waits for 1B0")
    assert any("[0B0]" in line for line in grid) and grid[0].startswith("step")


def test_csv_round_trip() -> None:
    s = generate("zb", 3, 6)
    back = from_csv_rows(s.to_csv_rows(), name="zb", n_microbatches=6)
    assert back.order == s.order


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(SCHEDULE_NAMES), P=st.integers(1, 6), M=st.integers(1, 20), v=st.integers(2, 3))
def test_generated_schedules_are_valid_and_complete(name: str, P: int, M: int, v: int) -> None:
    v = v if name == "interleaved" else 1
    if not valid_microbatches(name, P, M):
        with pytest.raises(ScheduleError):
            generate(name, P, M, v)
        return
    s = generate(name, P, M, v)
    validate(s)
    acts = [a for r in range(P) for a in s.actions(r)]
    kinds = ("F", "I", "W") if name == "zb" else ("F", "B")
    expected = {Action(st_, k, m) for st_ in range(P * v) for k in kinds for m in range(M)}
    assert len(acts) == len(expected) and set(acts) == expected


@pytest.mark.parametrize(("P", "M"), [(4, 2), (4, 4), (4, 9), (3, 16)])
def test_inflight_peaks(P: int, M: int) -> None:
    assert stage_inflight_peak(generate("gpipe", P, M)) == [M] * P
    if M >= P:
        assert stage_inflight_peak(generate("1f1b", P, M)) == [min(M, P - s) for s in range(P)]
    if valid_microbatches("zb", P, M):
        # ZB-H1 frees activations only after W: every stage peaks at P, 1F1B's (first-stage) peak
        assert max(stage_inflight_peak(generate("zb", P, M))) == min(M, P)


def test_rank_activation_peak_counts_transient_during_backward() -> None:
    s = generate("1f1b", 2, 4)
    assert rank_activation_peak(s, 0, [10.0, 1.0], [0.0, 0.0]) == 20.0
    # transient only while stage 0's backward runs, when 2 micro-batches are in flight
    assert rank_activation_peak(s, 0, [10.0, 1.0], [5.0, 0.0]) == 25.0
    s2 = generate("interleaved", 2, 4, 2)
    peak = rank_activation_peak(s2, 0, [1.0, 0.0, 100.0, 0.0], [0.0] * 4)
    # rank 0 runs 0F0 0F1 2F0 2F1 0F2 2B0 ...: during 0F2 stage 0 holds 3, stage 2 holds 2
    assert peak == 3 * 1.0 + 2 * 100.0
    with pytest.raises(ScheduleError):
        rank_activation_peak(s, 0, [1.0], [0.0])
