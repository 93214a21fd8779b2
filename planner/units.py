"""Parsing and printing of sizes, bandwidths and durations given on the command line."""

from __future__ import annotations

import math
import re

from planner.errors import PplanError
from planner.limits import MAX_BANDWIDTH, MAX_LATENCY_MS, MAX_MEMORY_BYTES, MIN_BANDWIDTH, MIN_LINK_BANDWIDTH

__all__ = ["parse_bytes", "parse_bandwidth", "parse_link_bandwidth", "parse_ms", "format_bytes", "format_ms",
           "format_share", "format_size_up", "plain_float", "plain_int", "PLAIN_NUMBER_HINT", "PLAIN_INTEGER_HINT"]

_BYTE_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
    "pb": 10**15, "pib": 2**50, "p": 2**50,  # MAX_BANDWIDTH is 1PB/s: its unit must parse
}
_NUMBER = r"([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)"


def _split(text: str | float, what: str, plain_unit: str, negative_hint: str, example: str,
           lower: bool = True) -> tuple[float, str]:
    """(number, unit) of `text`, the unit lower-cased unless `lower` is False; a plain number has
    `plain_unit`. Refuses a negative."""
    if isinstance(text, (int, float)):
        return float(text), plain_unit
    if text.strip().startswith("-"):
        raise PplanError(f"{what} {text!r} is negative", negative_hint)
    m = re.fullmatch(_NUMBER + r"\s*([A-Za-z/]*)", text.strip())
    if not m:
        raise PplanError(f"cannot read {what} {text!r}", f"write it like {example}")
    return float(m.group(1)), m.group(2).lower() if lower else m.group(2)


def parse_bytes(text: str | int | float, what: str = "size") -> int:
    """'16GiB', '500MB', '1e9' or a plain number of bytes -> int bytes (> 0)."""
    value, unit = _split(text, what, "", "give a positive size such as 16GiB", "16GiB, 500MB or 1000000")
    if unit not in _BYTE_UNITS:
        raise PplanError(f"unknown unit {unit!r} in {what} {text!r}", "use B, KB, MB, GB, KiB, MiB or GiB")
    result = value * _BYTE_UNITS[unit]
    if not math.isfinite(result):  # 1e400 reads as infinity: too large, not negative
        raise PplanError(f"{what} {text!r} is too large (not a finite number)", "give a real device size such as 80GiB")
    if result <= 0:
        raise PplanError(f"{what} {text!r} must be positive", "give a size such as 16GiB")
    if result < 1:  # would round to 0 bytes: a device with no memory
        raise PplanError(f"{what} {text!r} is less than one byte", "give a size such as 16GiB (units: B, KB, MB, GB, KiB, MiB, GiB)")
    if result > MAX_MEMORY_BYTES:
        raise PplanError(f"{what} {text!r} is absurdly large ({result:.3g} bytes)", "give a real device size such as 80GiB")
    return int(result)


def _rate_unit(unit: str) -> tuple[str, bool]:
    """(the unit's size prefix with 'b', as a _BYTE_UNITS key; whether it counts bits) of a
    bandwidth unit as written. Case decides, as in networking: B is a byte, b a bit
    ('100Mbps', '200 Gb/s' are bits; '25GB/s', '25MBps' bytes); 'bit' spells bits out."""
    base = unit[:-2] if unit.lower().endswith(("/s", "ps")) else unit
    for bit_word in ("bits", "bit"):
        if base.lower().endswith(bit_word):
            return base[: -len(bit_word)].lower() + "b", True
    if base.endswith("b"):
        return base[:-1].lower() + "b", True
    if base.endswith("B"):
        return base[:-1].lower() + "b", False
    return base.lower(), False  # '25G/s', a plain number: bytes, as sizes are


def parse_bandwidth(text: str | float, what: str = "bandwidth", least: float = MIN_BANDWIDTH) -> float:
    """'25GB/s', '100Gbit/s', '100Mbps' (bits), '1e9' (bytes/s) -> bytes per second, `least` to
    MAX_BANDWIDTH (by default planner.limits' range, which a plan's links are held to)."""
    value, unit = _split(text, what, "", "give e.g. 25GB/s", "25GB/s", lower=False)
    key, bits = _rate_unit(unit)
    if bits and key[:1] in ("m", "g", "t") and unit[:1].islower() and "bit" not in unit.lower():
        # all lower case ('25gb/s', '100mbps'): bits by the letter, but as often meant as bytes
        prefix = key[:-1].capitalize()  # 'g' -> 'G', 'gi' -> 'Gi'
        raise PplanError(f"{what} {text!r} is ambiguous: a lower-case b is a bit, B a byte",
                         f"write {value:g}{prefix}B/s for bytes or {value:g}{prefix}bit/s for bits")
    if key not in _BYTE_UNITS:
        raise PplanError(f"unknown bandwidth unit in {what} {text!r}", "use e.g. 25GB/s, 400MB/s or 100Gbit/s (bits)")
    result = value * _BYTE_UNITS[key] / (8 if bits else 1)
    in_bytes = f" ({result:.3g} bytes/s)" if unit else ""  # a plain number is bytes/s already
    if least >= MIN_LINK_BANDWIDTH and 0 < result < least:
        as_read = "" if isinstance(text, (int, float)) else f" ({result:g} bytes/s)"  # '300' is 300 bytes/s: say so
        raise PplanError(f"{what} {text!r}{as_read} is below {least:g} bytes/s (1MB/s), slower than any real link",
                         "a plain number is bytes/s: write the unit, e.g. \"25GB/s\" or \"200Gbit/s\"")
    if not (math.isfinite(result) and least <= result <= MAX_BANDWIDTH):
        # a value below the plans' range (0.5B/s, 1e-300GB/s) passed here and was refused later as
        # a plan field, without the file it came from
        raise PplanError(f"{what} {text!r}{in_bytes} is out of range ({least:g} to {MAX_BANDWIDTH:g} bytes/s)",
                         f"give a value from {format_rate(least)} to 1PB/s, such as 25GB/s")
    return result


def parse_ms(text: str | float, what: str = "latency") -> float:
    """'0.01ms', '5us', '1s', or a plain number of milliseconds -> milliseconds, 0 to MAX_LATENCY_MS
    (the range a plan's links are held to; a file with a tighter one checks it after, with its unit)."""
    value, unit = _split(text, what, "ms", "give 0 or more, e.g. 0.01ms", "0.01ms")
    scale = {"": 1.0, "ms": 1.0, "us": 1e-3, "ns": 1e-6, "s": 1e3}.get(unit)
    if scale is None:
        raise PplanError(f"unknown time unit in {what} {text!r}", "use s, ms, us or ns")
    result = value * scale
    if result < 0:  # a JSON number (text with a '-' is refused by _split)
        raise PplanError(f"{what} {text!r} is negative", "give 0 or more, e.g. 0.01ms or 5us")
    if not (math.isfinite(result) and result <= MAX_LATENCY_MS):
        raise PplanError(f"{what} {text!r} is out of range (0 to {MAX_LATENCY_MS:g} ms)", "give e.g. 0.01ms or 5us")
    return result


def format_bytes(n: float) -> str:
    """Human-readable binary size: 1536 -> '1.5 KiB'."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def format_ms(ms: float) -> str:
    """Milliseconds with a sensible number of digits."""
    if ms >= 1000:
        return f"{ms / 1000:.2f} s"
    if ms >= 10:
        return f"{ms:.1f} ms"
    return f"{ms:.3f} ms"


def format_share(part: float, whole: float) -> str:
    """`part` as a whole percentage of `whole`, never a bare "0%" for a part that is there ("<1%")."""
    share = part / whole
    return f"{share:.0%}" if share >= 0.005 or share == 0 else "<1%"


def format_size_up(n_bytes: float) -> str:
    """A size rounded up to 0.01 GiB (or 0.01 MiB below 1 GiB), written so --memory parses it."""
    if n_bytes >= 2**30:
        return f"{math.ceil(n_bytes / 2**30 * 100) / 100:.2f}GiB"
    return f"{math.ceil(n_bytes / 2**20 * 100) / 100:.2f}MiB"


def parse_link_bandwidth(text: str | float, what: str = "bandwidth") -> float:
    """parse_bandwidth for a link a user gives (--bandwidth, a cluster or hardware file), refused
    below MIN_LINK_BANDWIDTH: slower than any real link, it is a unit slip (a plain 300 meant as
    300GB/s reads as 300 bytes/s). Plans keep parse_bandwidth's wider range."""
    return parse_bandwidth(text, what, MIN_LINK_BANDWIDTH)


def format_rate(bytes_per_s: float) -> str:
    """1 -> '1B/s', 1e6 -> '1MB/s': a bound as --bandwidth takes it."""
    for unit, scale in (("PB/s", 1e15), ("TB/s", 1e12), ("GB/s", 1e9), ("MB/s", 1e6), ("KB/s", 1e3)):
        if bytes_per_s >= scale:
            return f"{bytes_per_s / scale:g}{unit}"
    return f"{bytes_per_s:g}B/s"


# Python's float() and int() also read `1_0` as 10 and other scripts' digits (`１２`, `١٢`) as 12: a
# typo or a hostile file would then change a seed or a time unseen. A file's numbers are ASCII
# decimals, with spaces around them (hand-written CSVs) and a sign (so `-1` is refused as negative,
# not as unreadable); nan and inf stay readable so that the readers refuse them as not finite.
# Without '_' and non-ASCII characters, what float() and int() accept is exactly that (their documented
# grammar: sign, digits, '.', exponent, nan/inf, whitespace), checked in 40 ns a cell where a regex
# took 230 (a 4,000-layer profile has half a million cells).
PLAIN_NUMBER_HINT = "write a plain decimal number with the digits 0-9, such as 12, 1.5 or 2e-3 (no '_', no other digits)"
PLAIN_INTEGER_HINT = "write a whole number with the digits 0-9, such as 12 (no '.', no '_', no other digits)"


def plain_float(text: str) -> float:
    """float(text) for a plain ASCII decimal (' 1.5 ', '+2e-3', '7', 'nan'); ValueError for anything else."""
    if not text.isascii() or "_" in text:
        raise ValueError(text)
    return float(text)


def plain_int(text: str) -> int:
    """int(text) for plain ASCII digits with an optional sign (' 12 ', '-3'); ValueError for anything
    else, '2.0' included, as int() has always refused it here."""
    if not text.isascii() or "_" in text:
        raise ValueError(text)
    return int(text)
