"""Profile metadata: the leading `# key: value` lines, each key with its check.

Every key pplan writes or reads is in META_KEYS; an unknown key is refused with the nearest
known one, so a typo (`seeed`) is not silently ignored. `edge` lines are parsed by
planner.graph.edges.read_edges.
"""

from __future__ import annotations

import math
from typing import Callable

from planner.errors import ProfileError
from planner.graph.edges import EDGE_KEY
from planner.jsonio import nearest
from planner.limits import MAX_MODEL_SPEC_CHARS, MAX_SEED
from planner.textsafe import MAX_TEXT_CHARS, check_text
from planner.units import PLAIN_INTEGER_HINT, PLAIN_NUMBER_HINT, plain_float, plain_int

__all__ = ["META_KEYS", "MAX_INPUT_ELEMENTS", "MAX_CO_RUN", "read_meta"]

# Elements in one sample of a factory model's input (--input-shape): 2**30 is 4 GiB of
# float32 per sample, far beyond any real input (a 512^3 volume is 2**27).
MAX_INPUT_ELEMENTS = 2**30
# Background processes of `pplan profile --co-run` (planner.profiling.corun): more than any one
# machine has cores; a larger number is a typo, and each process holds a copy of the model.
MAX_CO_RUN = 1024

def _free_text(value: str) -> str | None:
    return None


_NOT_AN_INTEGER = "is not an integer"
_NOT_A_NUMBER = "is not a number"
_NOT_A_SHAPE = "is not a comma-separated list of integers (one sample, e.g. 3,32,32)"


def _integer(low: int, high: int, empty_ok: bool = False) -> Callable[[str], str | None]:
    def check(value: str) -> str | None:
        if empty_ok and not value:
            return None
        try:
            n = plain_int(value)
        except ValueError:
            return _NOT_AN_INTEGER
        return None if low <= n <= high else f"is out of range ({low}..{high})"
    return check


def _number(high: float) -> Callable[[str], str | None]:
    def check(value: str) -> str | None:
        try:
            x = plain_float(value)
        except ValueError:
            return _NOT_A_NUMBER
        if not math.isfinite(x) or x < 0:
            return "is not a finite number >= 0"
        return None if x <= high else f"is too large (limit {high:.0e})"
    return check


def _input_shape(value: str) -> str | None:
    if not value:
        return None
    try:
        dims = [plain_int(d) for d in value.split(",")]
    except ValueError:
        return _NOT_A_SHAPE
    if len(dims) > 16 or any(d < 1 for d in dims):
        return "needs 1 to 16 dimensions, each at least 1"
    if math.prod(dims) > MAX_INPUT_ELEMENTS:
        return f"has more than {MAX_INPUT_ELEMENTS} elements per sample"
    return None


def _layer_indices(value: str) -> str | None:
    """Comma-separated layer indices (0 or more each); whether each names a layer of the profile is
    left to the reader that names them (planner.cost.model_flops), which shows an unknown index as is."""
    try:
        indices = [plain_int(i) for i in value.split(",")] if value else []
    except ValueError:
        return "is not a comma-separated list of layer indices (e.g. 1,4)"
    return None if all(i >= 0 for i in indices) else "lists a negative layer index"


def _dtype(value: str) -> str | None:
    """A dtype pplan profiles in: the cost model reads parameters and precision from it."""
    from planner.hardware import DTYPE_BYTES

    if value in DTYPE_BYTES:
        return None
    guess = nearest(value, DTYPE_BYTES)
    return f"is not one of {', '.join(DTYPE_BYTES)}" + (f" (did you mean {guess!r}?)" if guess else "")


def _input_dtype(value: str) -> str | None:
    from planner.models.spec import INPUT_DTYPES

    return None if not value or value in INPUT_DTYPES else f"is not one of {', '.join(INPUT_DTYPES)}"


# Every metadata key pplan writes or reads, with its check (None: fine, else what is wrong).
META_KEYS: dict[str, Callable[[str], str | None]] = {
    "format": _free_text,  # compared with FORMAT below
    "model": _free_text,
    "seed": _integer(0, MAX_SEED),  # the bound plans and --seed hold a seed to: a profile's seed becomes its plans'
    "input_shape": _input_shape,
    "input_dtype": _input_dtype,
    "vocab": _integer(1, 2**31 - 1, empty_ok=True),
    "input_bytes_per_sample": _number(1e18),
    # bytes of one sample of the training target (the last stage holds the step's targets); absent in
    # profiles made before pplan wrote it, which the cost model reads as 0, as it did then
    "target_bytes_per_sample": _number(1e18),
    "device": _free_text,
    "device_name": _free_text,
    "dtype": _dtype,
    "torch": _free_text,
    "threads": _integer(0, 10**6),
    "date": _free_text,
    "command": _free_text,
    "warmup": _integer(0, 10**9),
    "repeats": _integer(0, 10**9),
    "elapsed_s": _number(1e9),
    "load_average": _number(1e6),  # 1-minute load while profiling (planner.hostinfo.load_average)
    "timer": _free_text,
    # processes that trained the model beside the profiler (`--co-run`); absent in older
    # profiles, which were all measured alone (0)
    "co_run": _integer(0, MAX_CO_RUN),
    # how the layer times were taken (planner.profiling.inorder); absent in profiles made before
    # 2026-12-04, which timed each layer alone
    "layer_timing": _free_text,
    "source": _free_text,  # planner.partition.synthetic / planner.profiling.analytic: what made the profile
    "analytic": lambda v: None if v in ("true", "false") else "is not true or false",  # computed, not measured
    "hardware": _free_text,  # the hardware preset an analytic profile was computed for
    # layers whose FLOPs torch's counter failed on (their flops cell is 0): planner.profiling.flops
    "flops_uncounted": _layer_indices,
}


def _check_shown_text(value: str, key: str, where: str) -> None:
    """Refuse a metadata value with a control or format character: the model and device are printed
    (`pplan profile` summaries, report figures), where an escape sequence would rewrite the reader's
    terminal. A model spec with per-layer lists, or a command holding one, is longer than a name may be."""
    check_text(value, f"metadata {key!r}", ProfileError, where, MAX_MODEL_SPEC_CHARS + MAX_TEXT_CHARS)  # a command holds a spec


def read_meta(lines: list[str], source: str) -> tuple[dict[str, str], int]:
    """(validated `# key: value` metadata, index of the header line) of the leading block."""
    meta: dict[str, str] = {}
    where: dict[str, int] = {}
    first = 0
    while first < len(lines) and (lines[first].startswith("#") or not lines[first].strip()):
        line = lines[first].lstrip("#").strip()
        first += 1
        if ":" not in line:
            continue  # a comment
        key, value = (part.strip() for part in line.split(":", 1))
        if key == EDGE_KEY:  # repeated edge lines are parsed by read_edges
            continue
        lineno = first
        if key not in META_KEYS:
            guess = nearest(key, META_KEYS)
            hint = f"did you mean {guess!r}?" if guess else "known keys: " + ", ".join(META_KEYS)
            raise ProfileError(f"{source}:{lineno}: unknown metadata key {key[:60]!r}",
                               hint + " (a comment line without ':' is ignored)")
        if key in meta:
            raise ProfileError(f"{source}:{lineno}: metadata key {key!r} given twice (first on line {where[key]})", "keep one of them")
        _check_shown_text(value, key, f"{source}:{lineno}")
        problem = META_KEYS[key](value)
        if problem:
            hint = {_NOT_A_NUMBER: PLAIN_NUMBER_HINT, _NOT_AN_INTEGER: PLAIN_INTEGER_HINT, _NOT_A_SHAPE: PLAIN_INTEGER_HINT}.get(problem)
            raise ProfileError(f"{source}:{lineno}: metadata {key!r}: {value[:60]!r} {problem}", hint)
        meta[key] = value
        where[key] = lineno
    return meta, first
