"""Reading one field of plan JSON: present or defaulted, of the right type, finite; objects and lists of them."""

from __future__ import annotations

import math
from typing import Any

from planner.errors import PlanError
from planner.jsonio import check_keys

__all__ = ["get_field", "as_object", "as_objects"]


def get_field(d: dict, key: str, kind: type | tuple, where: str, default: Any = ...) -> Any:
    """`d[key]`, which must be of `kind` (bool is not a number) and finite; `default` when absent
    (PlanError "missing field {where}{key}" when there is none). The records of plan/records.py
    are read by this from plans and simulation JSONs alike, so messages say "field", and the
    reader puts the file's path in front."""
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
    return value


def _in_words(kinds: tuple[type, ...]) -> str:
    """'a number' for (int, float); else the first kind in words ('an integer', 'a list'), as the
    run and simulation readers (planner.jsontypes) say them."""
    if float in kinds:
        return "a number"
    words = {int: "an integer", str: "a string", bool: "true or false", list: "a list", dict: "an object"}
    return words.get(kinds[0], kinds[0].__name__)


def as_object(value: Any, where: str) -> dict:
    """`value`, which must be a JSON object."""
    if not isinstance(value, dict):
        raise PlanError(f"field {where} must be an object, got {type(value).__name__}")
    return value


def as_objects(value: Any, where: str, known: tuple[str, ...]) -> list[dict]:
    """`value` as a list of objects whose keys are all in `known`."""
    if not isinstance(value, list):
        raise PlanError(f"field {where} must be a list, got {type(value).__name__}")
    for i, item in enumerate(value):
        check_keys(as_object(item, f"{where}[{i}]"), known, f"{where}[{i}]", PlanError)
    return value
