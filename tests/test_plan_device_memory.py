"""A plan's devices[i].memory_bytes counts whole bytes: a fraction is refused quoting the value as
written (before, int() made 0.5 a device of 0 bytes and the message said `memory_bytes 0`); a whole
number written as a float (16e9) is read as that many bytes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.errors import PlanError
from planner.plan import plan_from_dict

DATA = Path(__file__).resolve().parent / "data"


def _plan(memory) -> dict:
    plan = json.loads((DATA / "sim_plan.json").read_text())
    plan["devices"][0]["memory_bytes"] = memory
    return plan


@pytest.mark.parametrize("memory", [0.5, 1.5, 16e9 + 0.5])
def test_fractional_bytes_are_refused_as_written(memory: float) -> None:
    with pytest.raises(PlanError) as e:
        plan_from_dict(_plan(memory))
    assert e.value.message == f"plan field devices[0].memory_bytes {memory!r} is not a whole number of bytes"
    assert "whole bytes" in e.value.hint


@pytest.mark.parametrize("memory, read", [(16e9, 16_000_000_000), (1.0, 1), (2**30, 2**30)])
def test_whole_numbers_are_read(memory, read: int) -> None:
    device = plan_from_dict(_plan(memory)).devices[0]
    assert device.memory_bytes == read and isinstance(device.memory_bytes, int)


def test_simulate_quotes_the_value(pplan, sim_work: Path) -> None:
    path = sim_work / "plan.json"
    path.write_text(json.dumps(_plan(0.5)))
    code, _, err = pplan("simulate", path)
    assert code == 2 and "devices[0].memory_bytes 0.5 is not a whole number of bytes" in err, err
