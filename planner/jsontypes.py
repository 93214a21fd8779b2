"""Whether a value read from JSON has the type a record's field declares, said in words.

A file's reader builds a frozen dataclass from what it read (planner.execute.runfile reads run
JSONs this way); the dataclass keeps whatever it is given, so the reader checks every field's
value against the field's annotation here and refuses the first that does not fit, on one line
that names the field and the value ("ranks[1] field 'busy_ms' must be a number, got '12'").
"""

from __future__ import annotations

import re
from dataclasses import MISSING, fields
from types import UnionType
from typing import Any, Union, get_args, get_origin

from planner.errors import PplanError
from planner.jsonio import check_keys

__all__ = [
    "is_number", "short", "conforms", "describe", "type_error", "missing_field", "check_object_keys", "check_index_keys",
    "objects_in", "INDEX_KEY",
]

INDEX_KEY = re.compile(r"[0-9]{1,9}")
"""The keys of an object keyed by device or stage index (JSON keys are text)."""


def is_number(x: Any) -> bool:
    """An int or float that is not a bool (JSON's true is not a number)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def short(value: Any) -> str:
    """A value for an error message: its repr, cut at 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def conforms(value: Any, hint: Any) -> bool:
    """Whether a value read from JSON fits an annotation (unions, lists, dicts, numbers, str, bool, None)."""
    origin, args = get_origin(hint), get_args(hint)
    if hint is Any:
        return True
    if origin in (Union, UnionType):
        return any(conforms(value, a) for a in args)
    if origin is list:
        return isinstance(value, list) and all(conforms(x, args[0]) for x in value)
    if origin is dict:
        return isinstance(value, dict) and all(conforms(x, args[1]) for x in value.values())
    if hint is float:
        return is_number(value)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is type(None):
        return value is None
    return isinstance(value, hint)


_NAMES = {float: ("a number", "numbers"), int: ("an integer", "integers"), str: ("a string", "strings"),
          bool: ("true or false", "booleans"), type(None): ("null", "nulls")}


def describe(hint: Any, plural: bool = False) -> str:
    """An annotation in words: `list[float] | None` -> 'a list of numbers or null'."""
    origin, args = get_origin(hint), get_args(hint)
    if origin in (Union, UnionType):
        return " or ".join(describe(a, plural) for a in args)
    if origin is list:
        return ("lists" if plural else "a list") + " of " + describe(args[0], plural=True)
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
    if get_origin(hint) is list and isinstance(value, list):
        i, item = next((i, x) for i, x in enumerate(value) if not conforms(x, get_args(hint)[0]))
        return f"{what} must be {describe(hint)}; item {i} is {short(item)}"
    return f"{what} must be {describe(hint)}, got {short(value)}"


def missing_field(record_type: type, data: dict[str, Any]) -> str | None:
    """The first field of the dataclass `record_type` that has no default and is not in `data`, or None."""
    for f in fields(record_type):
        if f.init and f.name not in data and f.default is MISSING and f.default_factory is MISSING:
            return f.name
    return None


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
