"""The schedule registry and the typed action kinds (planner.schedules.registry, .actions).

One registry names every schedule family and what it supports; the action kind is an enum
whose members are also their torch letters. These tests hold the registry to the generated
schedules, to torch's class names, and to the other modules that list schedules.
"""

from __future__ import annotations

import dataclasses

import pytest

from planner.errors import ScheduleError
from planner.schedules import (
    SCHEDULE_NAMES, SCHEDULES, Action, ActionKind, ScheduleSpec, check_sizes, generate, get_schedule, parse_action,
    valid_microbatches,
)
from planner.schedules.actions import KINDS, N_KINDS
from planner.schedules.compiled import KIND_CODE, action_id, compile_schedule


def test_names_are_the_registry_keys_in_tie_break_order() -> None:
    assert SCHEDULE_NAMES == tuple(SCHEDULES) == ("gpipe", "1f1b", "interleaved", "zb")
    for name, spec in SCHEDULES.items():
        assert get_schedule(name) is spec and spec.name == name


def test_unknown_schedule_names_the_known_ones() -> None:
    with pytest.raises(ScheduleError, match="unknown schedule 'pipedream'") as err:
        get_schedule("pipedream")
    assert "gpipe" in (err.value.hint or "")
    with pytest.raises(ScheduleError):
        check_sizes("pipedream", 2, 2)


@pytest.mark.parametrize("name", SCHEDULE_NAMES)
def test_generated_schedule_has_what_the_spec_says(name: str) -> None:
    spec = get_schedule(name)
    P, M, v = 3, 6, spec.virtual_stages
    sched = generate(name, P, M, v)
    assert sched.n_stages == P * v and sched.name == name
    assert sched.split_backward == spec.split_backward
    assert spec.multi_chunk == (v > 1)
    kinds = {a.kind for r in range(P) for a in sched.actions(r)}
    assert kinds == ({ActionKind.FORWARD, ActionKind.BACKWARD_INPUT, ActionKind.BACKWARD_WEIGHT} if spec.split_backward
                     else {ActionKind.FORWARD, ActionKind.FULL_BACKWARD})
    assert all(type(a.kind) is ActionKind for r in range(P) for a in sched.actions(r))
    wrong_v = 1 if spec.multi_chunk else 2
    with pytest.raises(ScheduleError):
        check_sizes(name, P, M, wrong_v)


@pytest.mark.parametrize("name", SCHEDULE_NAMES)
@pytest.mark.parametrize(("P", "M"), [(4, 2), (4, 3), (4, 4), (4, 6), (4, 8), (3, 7), (2, 9)])
def test_microbatch_rule_is_torchs(name: str, P: int, M: int) -> None:
    spec = get_schedule(name)
    rounds = max(1, M // P)
    want = {"any": True, "at-least-ranks": M >= P, "multiple-of-rounds": M % rounds == 0}[spec.microbatches]
    assert spec.valid_microbatches(P, M) == valid_microbatches(name, P, M) == want
    if want:
        check_sizes(name, P, M, spec.virtual_stages)
    else:
        with pytest.raises(ScheduleError, match=f"M={M}"):
            check_sizes(name, P, M, spec.virtual_stages)


def test_torch_classes_exist() -> None:
    torch_sched = pytest.importorskip("torch.distributed.pipelining.schedules")
    for spec in SCHEDULES.values():
        assert isinstance(getattr(torch_sched, spec.torch_class), type), spec.torch_class
        assert spec.torch_runtime in ("class", "class-if-same-order", "csv")


def test_other_modules_list_the_registry() -> None:
    from planner.bench import fidelity, simulator_bench

    assert simulator_bench.SCHEDULES == SCHEDULE_NAMES
    assert tuple(fidelity.DEFAULT_GRID[0].schedules) == SCHEDULE_NAMES


def test_a_new_registry_entry_is_all_a_schedule_needs(monkeypatch: pytest.MonkeyPatch) -> None:
    """GPipe with its backwards in reverse order: one entry, and generate/check_sizes know it."""
    def reverse_gpipe(P: int, M: int, v: int) -> dict[int, list[Action]]:
        F, B = ActionKind.FORWARD, ActionKind.FULL_BACKWARD
        return {r: [Action(r, F, m) for m in range(M)] + [Action(r, B, m) for m in reversed(range(M))] for r in range(P)}

    spec = dataclasses.replace(get_schedule("gpipe"), name="gpipe-reverse", order=reverse_gpipe)
    monkeypatch.setitem(SCHEDULES, spec.name, spec)
    sched = generate("gpipe-reverse", 2, 3)
    assert [str(a) for a in sched.actions(0)] == ["0F0", "0F1", "0F2", "0B2", "0B1", "0B0"]
    assert isinstance(spec, ScheduleSpec)


def test_action_kind_is_its_torch_letter() -> None:
    assert KINDS == ("F", "B", "I", "W") and N_KINDS == len(ActionKind) == 4
    for code, kind in enumerate(ActionKind):
        assert kind == kind.value and hash(kind) == hash(kind.value)
        assert str(kind) == f"{kind}" == kind.value == KINDS[code]
        assert kind.code == code == KIND_CODE[kind] == KIND_CODE[kind.value]
    assert Action(1, "W", 2) == Action(1, ActionKind.BACKWARD_WEIGHT, 2)
    assert Action(1, "W", 2).kind is ActionKind.BACKWARD_WEIGHT
    assert str(parse_action(" 3I4 ")) == "3I4" and parse_action("3I4").kind is ActionKind.BACKWARD_INPUT
    with pytest.raises(ScheduleError, match="'X'"):
        Action(0, "X", 0)


@pytest.mark.parametrize("name", SCHEDULE_NAMES)
def test_action_ids_round_trip(name: str) -> None:
    spec = get_schedule(name)
    sched = generate(name, 2, 4, spec.virtual_stages)
    cs = compile_schedule(sched)
    seen = set()
    for r in range(sched.n_ranks):
        for a in sched.actions(r):
            aid = cs.id_of(a)
            assert aid == action_id(a.kind.code, a.stage, a.microbatch, cs.n_stages, cs.n_microbatches)
            assert cs.split_id(aid) == (a.kind.code, a.stage, a.microbatch)
            assert cs.describe(aid) == str(a) and 0 <= aid < cs.n_ids
            seen.add(aid)
    assert len(seen) == sum(len(sched.actions(r)) for r in range(sched.n_ranks))
    assert cs.n_keys == N_KINDS * cs.n_stages
