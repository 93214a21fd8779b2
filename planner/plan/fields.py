"""Reading one of a plan's own fields (stages, devices, links, ...): present or defaulted, of the right
type, finite; lists of objects. The records a plan carries (`predicted`, `search`) are read by
planner.jsontypes.record_fields instead (planner.plan.records)."""

from __future__ import annotations

import math
import sys
from typing import Any

from planner.errors import PlanError
from planner.jsonio import check_keys

__all__ = ["get_field", "as_objects"]


def get_field(d: dict, key: str, kind: type | tuple, where: str, default: Any = ...) -> Any:
    """`d[key]`, which must be of `kind` (bool is not a number) and finite; `default` when absent
    (PlanError "missing field {where}{key}" when there is none); load_plan puts the file's path in front."""
    if key not in d:
        if default is ...:
            raise PlanError(f"missing field {where}{key}")
        return default
    value = d[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds:
        raise PlanError(f"field {where}{key} must be {_in_words(kinds)}, got {value!r}")
    if not isinstance(value, kinds):
        raise PlanError(f"field {where}{key} must be {_in_words(kinds)}, got {type(value).__name__} {value!r}"[:200])
    if isinstance(value, float) and not math.isfinite(value):
        raise PlanError(f"field {where}{key} must be finite, got {value!r}")
    if float in kinds and isinstance(value, int) and not isinstance(value, bool) and abs(value) > sys.float_info.max:
        # JSON caps integers at 40 digits, a dict built in Python does not: float() would raise OverflowError
        raise PlanError(f"field {where}{key} is out of range ({len(str(abs(value)))} digits)", "give a finite number")
    return value


def _in_words(kinds: tuple[type, ...]) -> str:
    """'a number' for (int, float); else the first kind in words ('an integer', 'a list'), as the
    run and simulation readers (planner.jsontypes) say them."""
    if float in kinds:
        return "a number"
    words = {int: "an integer", str: "a string", bool: "true or false", list: "a list", dict: "an object"}
    return words.get(kinds[0], kinds[0].__name__)


def as_objects(value: Any, where: str, known: tuple[str, ...]) -> list[dict]:
    """`value` as a list of objects whose keys are all in `known`."""
    if not isinstance(value, list):
        raise PlanError(f"field {where} must be a list, got {type(value).__name__}")
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise PlanError(f"field {where}[{i}] must be an object, got {type(item).__name__}")
        check_keys(item, known, f"{where}[{i}]", PlanError)
    return value
