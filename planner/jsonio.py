"""Reading files someone else wrote: bounded, strict JSON, no silently ignored keys.

Every plan, cluster, calibration and run file may come from another person. Reading one
must never hang (a FIFO, /dev/zero), never read without bound, never accept a key it does
not understand (a typo like `memroy` would otherwise be silently ignored), and never turn
odd JSON (duplicate keys, 1e400, a 5,000-digit integer, 100,000 nested brackets) into a
traceback. Each failure is the caller's PplanError subclass with one line and a hint.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import IO, Any

from planner.errors import PplanError

__all__ = [
    "finite_or_null",
    "MAX_JSON_BYTES",
    "MAX_JSON_DEPTH",
    "read_bounded_bytes",
    "open_regular",
    "read_bounded_text",
    "loads_strict",
    "read_json_file",
    "check_keys",
    "nearest",
]

# A plan for 20,000 layers on 4,096 devices is a few MB; 64 MiB is far beyond any real file
# and still small enough to read without risk on a laptop.
MAX_JSON_BYTES = 64 * 1024 * 1024
# pplan's own files nest 4 levels deep; 64 leaves room for hand-written extras while keeping
# Python's recursive decoder far from its recursion limit.
MAX_JSON_DEPTH = 64
# Integers longer than this are not sizes or counts any machine has (1e30 bytes is 30 digits).
_MAX_INT_DIGITS = 40


def read_bounded_bytes(path: str | os.PathLike, what: str, error: type[PplanError], max_bytes: int) -> bytes:
    """The bytes of the regular file `path`, refusing FIFOs, devices and files over `max_bytes`.

    The type is checked with stat before opening, so a FIFO or /dev/zero never blocks or
    streams forever; the read itself stops at max_bytes + 1 in case the file grows meanwhile.
    """
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise error(f"{what} {str(p)!r} does not exist") from None
    except OSError as e:
        raise error(f"cannot read {what} {str(p)!r}: {e.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        raise error(f"{what} {str(p)!r} is a directory, not a file")
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{what} {str(p)!r} is not a regular file (a device, FIFO or socket)", "give the path of a file on disk")
    if st.st_size > max_bytes:
        raise error(f"{what} {str(p)!r} is {st.st_size} bytes, more than the {max_bytes} bytes any such file needs", "check that this is the right file")
    try:
        with open(p, "rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError as e:
        raise error(f"cannot read {what} {str(p)!r}: {e.strerror}") from None
    if len(data) > max_bytes:
        raise error(f"{what} {str(p)!r} grew past {max_bytes} bytes while being read")
    return data


def open_regular(path: str | os.PathLike) -> tuple[IO[bytes], os.stat_result] | None:
    """(the open file, its stat) when `path` is a regular file, else None (OSError when unreadable).

    Stat before open, as read_bounded_bytes does: a device is never opened. A FIFO swapped in after
    the stat does not block the open (O_NONBLOCK), and is caught by comparing the open file's
    device and inode with the stat's: what is hashed and loaded is the file that was checked."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        return None
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    opened = os.fstat(fd)
    if (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino) or not stat.S_ISREG(opened.st_mode):
        os.close(fd)
        return None
    return os.fdopen(fd, "rb"), opened


def read_bounded_text(path: str | os.PathLike, what: str, error: type[PplanError], max_bytes: int) -> str:
    """`read_bounded_bytes` decoded as UTF-8 (a BOM is allowed)."""
    data = read_bounded_bytes(path, what, error, max_bytes)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise error(f"{what} {str(path)!r} is not UTF-8 text (byte {e.start})", "save it as UTF-8") from None


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Refused(f"key {key!r} appears twice in one object", "keep one of them")
        out[key] = value
    return out


class _Refused(ValueError):
    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"number {text[:40]!r} is out of range", "use a finite number")
    return value


def _parse_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > _MAX_INT_DIGITS:
        raise _Refused(f"integer with {digits} digits is out of range (at most {_MAX_INT_DIGITS})", "check the value")
    return int(text)


def _parse_constant(name: str) -> float:
    raise _Refused(f"{name} is not a number JSON allows here", "use a finite number")


_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)', re.DOTALL)
"""A JSON string literal, escapes included, or an unterminated one to the end of the text. Written as
an unrolled loop, which matches at every quote it starts from: the former `"(?:[^"\\]|\\.)*"` failed on
an unterminated string and was retried from every escaped quote after it (90 KB of `a\\"` took 62 s)."""
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def _depth_exceeds(text: str, limit: int) -> bool:
    """True when brackets nest deeper than `limit` (strings are skipped, escapes honoured). The strings
    and everything but brackets are dropped by regular expressions first: a character loop in Python
    spent 7 s on a 57 MB file before json.loads saw it."""
    depth = 0
    for ch in _NOT_BRACKET.sub("", _JSON_STRING.sub("", text)):
        if ch in "[{":
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


_SURROGATE = re.compile("[\ud800-\udfff]")
_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")


def _may_hold_surrogate(text: str) -> bool:
    """Whether parsing `text` may yield a lone surrogate: only a \\uD800-\\uDFFF escape (a pair's
    halves look the same) or a str that already holds one does. A file with neither skips the walk
    of _not_unicode; these scans took 13-29 ms on a 48 MB plan, a search for the characters 170-300 ms."""
    if _ESCAPED_SURROGATE.search(text) is not None:
        return True
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _not_unicode(value: Any, where: str) -> str | None:
    """Where in `value` (parsed JSON) a string or key holds a lone surrogate, in words; None when none
    does. Such a string is no Unicode text: printing or writing it as UTF-8 raises UnicodeEncodeError."""
    if isinstance(value, str):
        found = _SURROGATE.search(value)
        return None if found is None else f"the string at {where or 'the top level'} ({_surrogate(found)})"
    if isinstance(value, dict):
        for key, item in value.items():
            found = _SURROGATE.search(key)
            if found is not None:
                return f"a key of {where or 'the top-level object'} ({_surrogate(found)})"
            name = key if len(key) <= 40 else key[:37] + "..."  # a message names the place, not a whole key
            inner = _not_unicode(item, f"{where}.{name}" if where else name)
            if inner is not None:
                return inner
    if isinstance(value, list):
        for i, item in enumerate(value):
            inner = _not_unicode(item, f"{where}[{i}]")
            if inner is not None:
                return inner
    return None


def _surrogate(found: re.Match) -> str:
    return f"a lone surrogate \\u{ord(found.group()):04x} at character {found.start()}"


def loads_strict(text: str, source: str, error: type[PplanError]) -> Any:
    """Parse JSON refusing duplicate keys, NaN/Infinity, 1e400, huge integers, deep nesting, and
    strings or keys that are not Unicode text (a lone surrogate escape such as \\ud800)."""
    if _depth_exceeds(text, MAX_JSON_DEPTH):
        raise error(f"{source}: JSON nests deeper than {MAX_JSON_DEPTH} levels", "pplan's files are a few levels deep; check the file")
    data = _loads(text, source, error)
    if _may_hold_surrogate(text) and (bad := _not_unicode(data, "")) is not None:
        raise error(f"{source}: {bad} is not valid Unicode text",
                    "write the character itself, or a character above U+FFFF as its \\uD8xx\\uDCxx pair")
    return data


def _loads(text: str, source: str, error: type[PplanError]) -> Any:
    """json.loads with the refusals of loads_strict, each as `error` naming `source`."""
    try:
        return json.loads(
            text,
            object_pairs_hook=_no_duplicates,
            parse_float=_parse_float,
            parse_int=_parse_int,
            parse_constant=_parse_constant,
        )
    except _Refused as e:
        raise error(f"{source}: {e.message}", e.hint) from None
    except json.JSONDecodeError as e:
        raise error(f"{source}:{e.lineno}:{e.colno}: invalid JSON ({e.msg})") from None
    except (ValueError, RecursionError) as e:  # int-digit limits and anything the checks above missed
        raise error(f"{source}: invalid JSON ({str(e)[:120]})") from None


def read_json_file(path: str | os.PathLike, what: str, error: type[PplanError], max_bytes: int = MAX_JSON_BYTES) -> Any:
    """A bounded read of the regular file `path` parsed with `loads_strict`."""
    text = read_bounded_text(path, what, error, max_bytes)
    return loads_strict(text, str(path), error)


def nearest(key: str, known: Iterable[str]) -> str | None:
    """The known key closest to `key` (difflib), or None when nothing is close."""
    known = list(known)
    # `h100` for `h100-80gb` (not the closer-spelled `h200`), `memory` for `memory_bytes`: a known
    # key that starts with the typed one is what was meant; the closest of them when several do
    starting = [k for k in known if key and k.startswith(key)]
    if starting:
        return (difflib.get_close_matches(key, starting, n=1, cutoff=0.0) or starting)[0]
    match = difflib.get_close_matches(key, known, n=1, cutoff=0.5)
    if match:
        return match[0]
    prefixed = [k for k in known if key.startswith(k)]  # `memory_bytes_x` for `memory_bytes`
    return prefixed[0] if prefixed else None


def check_keys(data: Mapping[str, Any], known: Iterable[str], where: str, error: type[PplanError]) -> None:
    """Refuse the first key of `data` not in `known`, suggesting the nearest known key."""
    known = tuple(known)
    for key in data:
        if key not in known:
            guess = nearest(str(key), known)
            hint = f"did you mean {guess!r}?" if guess else "known keys: " + ", ".join(known)
            raise error(f"{where}: unknown key {str(key)[:60]!r}", hint)


def finite_or_null(obj: Any) -> Any:
    """`obj` with every non-finite float (inf, nan) as None, through dicts, lists and tuples:
    JSON has no inf or nan, and a file with them is refused by strict readers (this one too)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_or_null(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_null(v) for v in obj]
    return obj
