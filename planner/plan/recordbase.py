"""The JSON round-trip shared by the records a plan carries (planner.plan.records): written in field
order, read through planner.jsontypes.record_fields with each list's length bounded first, each
number (and each number of a list) held to its field's range, each string held to one line a
terminal can show, nested records read by their own readers."""

from __future__ import annotations

import math
from dataclasses import fields
from functools import cache
from typing import Any, ClassVar, get_args, get_origin, get_type_hints

from planner.errors import PlanError
from planner.jsontypes import is_number, range_error, record_fields, short, to_json
from planner.limits import MAX_GLOBAL_BATCH, MAX_MEMORY_BYTES
from planner.plan.bounds import MAX_PREDICTED_MS, check_text

__all__ = ["JsonRecord", "TIME_RANGE", "BYTES_RANGE", "COUNT_RANGE"]

# The ranges the records declare most (`predicted` and `search` hold the same kinds of numbers)
TIME_RANGE = (0.0, MAX_PREDICTED_MS)
"""A time a plan records, ms."""
BYTES_RANGE = (0.0, float(MAX_MEMORY_BYTES))
"""A memory size a plan records, bytes."""
COUNT_RANGE = (1, MAX_GLOBAL_BATCH)
"""A micro-batch count or size."""


class JsonRecord:
    """Shared JSON round-trip of a plan's records (planner.plan.records; every field defaults to None)."""

    _WRITE_NULL: ClassVar[frozenset[str]] = frozenset()
    _RANGES: ClassVar[dict[str, tuple[float, float]]] = {}
    """Field -> (low, high) of its number, or of each number its list holds (both ends allowed)."""
    _ALL_BYTES: ClassVar[bool] = False
    """Every field is a byte count (MemoryRecord); elsewhere the fields named *_bytes are."""
    _HINT: ClassVar[str | None] = None
    """What a refusal of this record suggests."""
    _LONGEST: ClassVar[dict[str, int]] = {}
    """Field -> the most items its list may hold, counted before any item is read."""
    _LONG_HINT: ClassVar[str] = ("pplan writes a few rows there: re-create the plan with `pplan partition`, "
                                 "or drop the `search` record (it is informational)")

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        """The JSON keys of this record, in the order written."""
        return tuple(f.name for f in fields(cls))  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict, keys in field order; None fields are left out unless in _WRITE_NULL."""
        out: dict[str, Any] = {}
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if value is not None or f.name in self._WRITE_NULL:
                out[f.name] = to_json(value)
        return out

    @classmethod
    def _check_texts(cls, d: dict[str, Any], where: str) -> None:
        """Every string of the record, and of its string lists, one line a terminal can show: names,
        notes and skipped lines are printed (planner.plan.bounds.check_text)."""
        for key, value in d.items():
            if isinstance(value, str):
                check_text(value, f"field {key!r}", where)
            elif isinstance(value, list) and value and isinstance(value[0], str):  # record_fields typed it: all are
                for i, text in enumerate(value):
                    check_text(text, f"field {key}[{i}]", where)

    @classmethod
    def _check_list_ranges(cls, d: dict[str, Any], where: str) -> None:
        """Each number of a list field in _RANGES within its range (record_fields checks single numbers).
        min and max first, in C: 1,000 rows of 4,001 cuts need no Python call per cut."""
        for name, (low, high) in cls._RANGES.items():
            listed = d.get(name)
            if not (isinstance(listed, list) and listed and is_number(listed[0])):  # record_fields typed it: all are
                continue
            if low <= min(listed) and max(listed) <= high:  # a NaN (no JSON has one) is refused by _from_json
                continue
            raise PlanError(next(m for i, x in enumerate(listed)
                                 if (m := range_error(x, low, high, f"{where} field '{name}[{i}]'"))), cls._HINT)

    @classmethod
    def from_dict(cls, d: Any, where: str) -> Any:
        """The record in JSON object `d` (at `where` in the plan); PlanError names a bad key or value.
        Each list's length is checked against _LONGEST first: reading rows one by one only to refuse
        or keep 150,000 of them took 44.6 s."""
        for name, most in cls._LONGEST.items():
            listed = d.get(name) if isinstance(d, dict) else None
            if isinstance(listed, list) and len(listed) > most:
                raise PlanError(f"{where} field {name!r} lists {len(listed)} items, more than a plan holds ({most})",
                                cls._LONG_HINT)
        d = record_fields(d, cls, where, error=PlanError, types=_byte_counts(cls), ranges=cls._RANGES,
                          hint=cls._HINT)
        cls._check_list_ranges(d, where)
        cls._check_texts(d, where)
        kinds = _value_types(cls)
        return cls(**{key: _from_json(value, kinds[key], where, key) for key, value in d.items() if value is not None})


@cache
def _value_types(cls: type[JsonRecord]) -> dict[str, Any]:
    """Each field's annotation without its `| None` (a plan holds many search rows: resolved once per type)."""
    return {name: next(a for a in get_args(hint) if a is not type(None))
            for name, hint in get_type_hints(cls).items() if name in cls.keys()}


@cache
def _byte_counts(cls: type[JsonRecord]) -> dict[str, Any]:
    """The JSON form of each byte count declared `int | None`: any number or null."""
    return {name: float | None for name, hint in get_type_hints(cls).items()
            if hint == int | None and (cls._ALL_BYTES or name.endswith("_bytes"))}


def _from_json(value: Any, kind: Any, where: str, name: str) -> Any:
    """Field `name`'s value, which record_fields let through as `kind`, built: a nested record by its own
    reader, a list as a tuple; a number that is not finite refused (a dict built in Python may hold one)."""
    if isinstance(kind, type) and issubclass(kind, JsonRecord):
        return kind.from_dict(value, f"{where}.{name}")
    if get_origin(kind) is tuple:
        item = get_args(kind)[0]
        if item is int:  # record_fields checked each item is one: up to 1,000 rows of 4,001 cuts need no call each
            return tuple(value)
        return tuple(_from_json(x, item, where, f"{name}[{i}]") for i, x in enumerate(value))
    if isinstance(value, float) and not math.isfinite(value):
        raise PlanError(f"{where} field {name!r} must be finite, got {short(value)}")
    return value
