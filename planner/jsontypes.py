"""Whether a value read from JSON has the type a record's field declares, said in words.

A file's reader builds a frozen dataclass from what it read (the run JSON and its nested records,
what a rank measured); the dataclass keeps whatever it is given, so every such reader passes the
JSON object through `record_fields` first: it refuses, in this order, a value that is not an
object, an unknown key (nearest known one suggested), the first missing field, and the first
value that does not fit its field's annotation, each on one line that names the field and the
value ("ranks[1] field 'busy_ms' must be a number, got '12'").

An annotation is read as its JSON form: a nested record (a dataclass) is a JSON object, which its
own reader then checks; `tuple[X, ...]` is a list of X; an object's keys are text.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import MISSING, fields, is_dataclass
from functools import cache
from types import UnionType
from typing import Any, Union, get_args, get_origin, get_type_hints

from planner.errors import PplanError
from planner.jsonio import check_keys

__all__ = [
    "is_number", "short", "conforms", "describe", "type_error", "missing_field", "record_fields", "check_object_keys",
    "check_index_keys", "objects_in", "INDEX_KEY", "to_json", "range_error", "file_kind", "kind_mismatch", "json_int",
]

INDEX_KEY = re.compile(r"[0-9]{1,9}")
"""The keys of an object keyed by device or stage index (JSON keys are text)."""


def is_number(x: Any) -> bool:
    """An int or float that is not a bool (JSON's true is not a number)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def json_int(value: Any) -> int | None:
    """`value` when it is a JSON integer (true and false are not), else None: what a count or an
    index is checked on before its field's own reader names a wrong type."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


_JSON_WORDS = {None: "null", True: "true", False: "false"}


def short(value: Any) -> str:
    """A value for an error message: its repr, cut at 60 characters; null, true and false as the
    JSON file that held them spells them (a user who wrote null is not told None)."""
    if value is None or isinstance(value, bool):
        return _JSON_WORDS[value]
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _items_of(hint: Any) -> Any:
    """The item type of `list[X]` or `tuple[X, ...]`, both a JSON list of X; None for anything else."""
    origin, args = get_origin(hint), get_args(hint)
    if origin is list:
        return args[0]
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return args[0]
    return None


def conforms(value: Any, hint: Any) -> bool:
    """Whether a value read from JSON fits an annotation (unions, lists and `tuple[X, ...]`, dicts,
    numbers, str, bool, None; a dataclass is a JSON object, which its own reader checks)."""
    # plain types first: a long run's step times and losses are lists of numbers, each checked here
    if hint is float:
        return is_number(value)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is Any:
        return True
    if hint is type(None):
        return value is None
    origin, args = get_origin(hint), get_args(hint)
    if origin in (Union, UnionType):
        return any(conforms(value, a) for a in args)
    if (item := _items_of(hint)) is not None:
        return isinstance(value, list) and all(conforms(x, item) for x in value)
    if is_dataclass(hint):
        return isinstance(value, dict)
    if origin is dict:
        return isinstance(value, dict) and all(conforms(x, args[1]) for x in value.values())
    return isinstance(value, hint)


_NAMES = {float: ("a number", "numbers"), int: ("an integer", "integers"), str: ("a string", "strings"),
          bool: ("true or false", "booleans"), type(None): ("null", "nulls")}


def describe(hint: Any, plural: bool = False) -> str:
    """An annotation in words: `list[float] | None` -> 'a list of numbers or null'."""
    origin, args = get_origin(hint), get_args(hint)
    if origin in (Union, UnionType):
        return " or ".join(describe(a, plural) for a in args)
    if (item := _items_of(hint)) is not None:
        return ("lists" if plural else "a list") + " of " + describe(item, plural=True)
    if hint is list:
        return "lists" if plural else "a list"
    if hint is Any:
        return "values" if plural else "any value"
    if origin is dict or hint not in _NAMES:
        of = "" if origin is not dict or args[1] is Any else " of " + describe(args[1], plural=True)
        return ("objects" if plural else "an object") + of
    return _NAMES[hint][plural]


def type_error(value: Any, hint: Any, what: str) -> str | None:
    """None when `value` fits `hint`; else the message that says so, naming `what` (and, for a
    list, the first item that does not fit: the list may be long)."""
    if conforms(value, hint):
        return None
    # a list names its first bad item, also where the field may be null (`list[float] | None`)
    members = get_args(hint) if get_origin(hint) in (Union, UnionType) else (hint,)
    item_hints = [item for member in members if (item := _items_of(member)) is not None]
    if len(item_hints) == 1 and isinstance(value, list):
        i, item = next((i, x) for i, x in enumerate(value) if not conforms(x, item_hints[0]))
        return f"{what} must be {describe(hint)}; item {i} is {short(item)}"
    return f"{what} must be {describe(hint)}, got {short(value)}"


def missing_field(record_type: type, data: dict[str, Any]) -> str | None:
    """The first field of the dataclass `record_type` that has no default and is not in `data`, or None."""
    for f in fields(record_type):
        if f.init and f.name not in data and f.default is MISSING and f.default_factory is MISSING:
            return f.name
    return None


@cache
def _field_hints(record_type: type) -> dict[str, Any]:
    """The resolved annotation of each field of `record_type` (resolved once per type: ranks have many)."""
    return get_type_hints(record_type)


def record_fields(data: Any, record_type: type, where: str, *, error: type[PplanError] = PplanError,
                  hint: str | None = None, types: Mapping[str, Any] | None = None,
                  keys: tuple[str, ...] | None = None, required: tuple[str, ...] | None = None,
                  ranges: Mapping[str, tuple[float, float]] | None = None) -> dict[str, Any]:
    """`data` as the JSON object of the dataclass `record_type`, at `where` in its file: refused with
    `error` (and `hint`) when it is not an object, has a key that is not a field (nearest one
    suggested), lacks a field without a default, or holds a value that does not fit its field's
    annotation (fields in declaration order). Nested records are left as objects for their readers.

    types: a field's JSON form where it differs from its annotation and cannot be derived (an
    ActionSpan written as a list); keys: the fields the JSON object may hold, when not all of them;
    required: the keys it must hold, when not the fields without a default; ranges: (low, high) of a
    numeric field, checked after its type (a bubble fraction of 7 or a peak of 1e300 bytes is refused).
    """
    if not isinstance(data, dict):
        raise error(f"{where} must be an object, got {short(data)}", hint)
    names = keys if keys is not None else tuple(f.name for f in fields(record_type) if f.init)
    check_keys(data, names, where, error)
    absent = (next((k for k in required if k not in data), None) if required is not None
              else missing_field(record_type, data))
    if absent is not None:
        raise error(f"{where}: missing field {absent!r}", hint)
    annotations = {**_field_hints(record_type), **(types or {})}
    for name in names:
        if name in data and (message := type_error(data[name], annotations[name], f"{where} field {name!r}")):
            raise error(message, hint)
    for name, (low, high) in (ranges or {}).items():
        if is_number(value := data.get(name)) and (message := range_error(value, low, high, f"{where} field {name!r}")):
            raise error(message, hint)
    return data


def range_error(value: float, low: float, high: float, what: str) -> str | None:
    """None when low <= value <= high; else the message naming `what`, the value and the range (NaN is out)."""
    if low <= value <= high:
        return None
    if value != value or value in (float("inf"), float("-inf")):  # JSON has neither; a dict built in Python may
        return f"{what} must be finite, got {value!r}"
    return f"{what} is {_number(value)}, out of range ({_number(low)} to {_number(high)})"


def _number(x: float) -> str:
    """A number for a message: an integer whole (a device index), a long one or a float to 6 digits."""
    if isinstance(x, int) and x.bit_length() > 1000:  # no float holds it (and str() refuses past 4,300 digits)
        return f"an integer of about {int(x.bit_length() * 0.30103)} digits"
    return str(x) if isinstance(x, int) and abs(x) < 10**12 else f"{x:.6g}"


_FORMAT = re.compile(r"pplan-([a-z]+)/[0-9]+")


def file_kind(data: Any) -> str | None:
    """Which pplan file an object read from JSON is, by its `format` key ('pplan-plan/1' -> 'plan'):
    a file handed to the wrong reader is then named for what it is. None without a pplan format."""
    fmt = data.get("format") if isinstance(data, dict) else None
    match = _FORMAT.fullmatch(fmt) if isinstance(fmt, str) else None
    if match:
        return match.group(1)
    if isinstance(data, dict) and "format" not in data and all(key in data for key in _SIMULATION_MARKS):
        return "sim"  # the one pplan file without a format: `pplan simulate --out`
    return None


_SIMULATION_MARKS = ("iteration_ms", "bubble_fraction", "devices")
"""Keys every simulation JSON has and no other pplan file has all of at its top level."""
_KIND_NAMES = {"plan": "plan", "run": "run", "sim": "simulation", "calibration": "calibration", "cluster": "cluster",
               "hardware": "hardware", "machine": "machine"}


def kind_mismatch(data: Any, expected: str) -> str | None:
    """None unless `data` is, by file_kind, another pplan file than `expected` ('plan', 'run', ...);
    then the words naming what it is ("this is a run file (format 'pplan-run/1'), not a plan")."""
    found = file_kind(data)
    if found is None or found == expected:
        return None
    want = _KIND_NAMES.get(expected, expected)
    if "format" not in data:
        return f"this is a simulation JSON (`pplan simulate --out`: iteration_ms, no format), not a {want}"
    return f"this is a {_KIND_NAMES.get(found, found)} file (format {short(data['format'])}), not a {want}"


def check_object_keys(data: Any, known: tuple[str, ...], where: str) -> None:
    """Refuse a key of `data`, when it is an object, that is not in `known` (nearest one suggested)."""
    if isinstance(data, dict):
        check_keys(data, known, where, PplanError)


def check_index_keys(data: Any, pattern: re.Pattern, what: str, where: str) -> None:
    """Refuse a key of `data`, an object keyed by data such as stage indices, that does not match `pattern`."""
    if isinstance(data, dict):
        for key in data:
            if not pattern.fullmatch(key):
                raise PplanError(f"{where}: unknown key {key[:60]!r}", f"its keys are {what}")


def objects_in(data: dict[str, Any], key: str) -> list[dict[str, Any]]:
    """The objects in the list `data[key]` (none when it is absent or not a list)."""
    value = data.get(key)
    return [x for x in value if isinstance(x, dict)] if isinstance(value, list) else []


def to_json(value: Any) -> Any:
    """A record field's value as JSON: a nested record through its to_dict, a list or tuple item by item."""
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    return value
