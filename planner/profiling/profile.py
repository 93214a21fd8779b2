"""The profile: per-layer time and memory at several micro-batch sizes, and its CSV format.

Format (version 1), UTF-8 CSV, one row per (layer, micro_batch_size):

    # format: pplan-profile/1          <- optional leading `# key: value` metadata lines
    # model: gpt:layers=4
    layer,name,micro_batch_size,fwd_ms,bwd_ms,param_bytes,activation_bytes,output_bytes[,optional...]

Units are milliseconds and bytes, all per micro-batch of `micro_batch_size` samples.
Optional columns (absent -> derived default): fwd_ms_std, bwd_ms_std, bwd_input_ms,
bwd_weight_ms (default: half of bwd_ms each), optimizer_ms (default 0), flops,
cuda_peak_bytes, shared_input_bytes (default 0: bytes of the layer's saved input that the
previous layer also saves, so a stage holding both keeps them once). Unknown extra columns
are ignored (and not written back). docs/profile-format.md has the full description.

A model that is not a chain adds one `# edge: <src>-><readers> <bytes_per_sample>` line per
skip tensor among the metadata (planner.graph.edges; docs/graph.md); a chain has none, so
its text is what it always was.

Loading validates everything a hand-edited file can get wrong and raises ProfileError with
the file, line and column.
"""

from __future__ import annotations

import bisect
import collections
import csv
import functools
import hashlib
import io
import itertools
import math
import os
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from planner.atomic import atomic_write_text
from planner.errors import ProfileError
from planner.graph.crossing import crossing_bytes, layer_inputs
from planner.graph.edges import EDGE_KEY, edge_lines, read_edges
from planner.jsonio import nearest, read_bounded_bytes

__all__ = [
    "FORMAT",
    "REQUIRED_COLUMNS",
    "OPTIONAL_COLUMNS",
    "MAX_LAYERS",
    "MAX_ROWS",
    "MAX_PROFILE_BYTES",
    "META_KEYS",
    "LayerCosts",
    "Profile",
    "load_profile",
    "profile_from_bytes",
    "read_profile_text",
    "write_profile",
]

FORMAT = "pplan-profile/1"
REQUIRED_COLUMNS = (
    "layer", "name", "micro_batch_size", "fwd_ms", "bwd_ms",
    "param_bytes", "activation_bytes", "output_bytes",
)
OPTIONAL_COLUMNS = (
    "fwd_ms_std", "bwd_ms_std", "bwd_input_ms", "bwd_weight_ms",
    "optimizer_ms", "flops", "cuda_peak_bytes", "shared_input_bytes",
)
_NUMERIC = tuple(c for c in REQUIRED_COLUMNS + OPTIONAL_COLUMNS if c not in ("layer", "name", "micro_batch_size"))
_INTEGER = ("param_bytes", "activation_bytes", "output_bytes", "flops", "cuda_peak_bytes", "shared_input_bytes")
# What `pplan partition` plans in reasonable time and memory (docs/profile-format.md): on a
# 2-core, 24 GiB machine 4,000 layers at 4 sizes took 25 s of CPU and 1.5 GB with 4 devices,
# 52 s and 1.4 GB with 8; 5,000 layers already 2.2 GB and 142 s of wall time. Memory grows
# about as L^1.6, so 20,000 layers extrapolates to ~20 GB and well over 10 minutes: not
# plannable on such a machine. Group layers into blocks beyond this.
MAX_LAYERS = 4_000
# One row per (layer, micro-batch size): e.g. 4,000 layers at 250 sizes, or 50,000 sizes of
# 20 layers. Bounds what loading holds in memory (about 100 bytes per row) whatever the file says.
MAX_ROWS = 1_000_000
# MAX_ROWS rows of up to ~250 bytes (every optional column, long layer names) is 250 MB; a
# real profile is far smaller (4,000 layers x 16 sizes x 130 bytes = 8 MB). Anything larger
# (or a device, a FIFO) is not a profile, and 256 MiB still reads and validates in seconds.
MAX_PROFILE_BYTES = 256 * 1024 * 1024
# No device trains a micro-batch of a billion samples; beyond it a size is a typo.
MAX_MICRO_BATCH_SIZE = 10**9
# Elements in one sample of a factory model's input (--input-shape): 2**30 is 4 GiB of
# float32 per sample, far beyond any real input (a 512^3 volume is 2**27).
_MAX_INPUT_ELEMENTS = 2**30


def _free_text(value: str) -> str | None:
    return None


def _integer(low: int, high: int, empty_ok: bool = False) -> Callable[[str], str | None]:
    def check(value: str) -> str | None:
        if empty_ok and not value:
            return None
        try:
            n = int(value)
        except ValueError:
            return "is not an integer"
        return None if low <= n <= high else f"is out of range ({low}..{high})"
    return check


def _number(high: float) -> Callable[[str], str | None]:
    def check(value: str) -> str | None:
        try:
            x = float(value)
        except ValueError:
            return "is not a number"
        if not math.isfinite(x) or x < 0:
            return "is not a finite number >= 0"
        return None if x <= high else f"is too large (limit {high:.0e})"
    return check


def _input_shape(value: str) -> str | None:
    if not value:
        return None
    try:
        dims = [int(d) for d in value.split(",")]
    except ValueError:
        return "is not a comma-separated list of integers (one sample, e.g. 3,32,32)"
    if len(dims) > 16 or any(d < 1 for d in dims):
        return "needs 1 to 16 dimensions, each at least 1"
    if math.prod(dims) > _MAX_INPUT_ELEMENTS:
        return f"has more than {_MAX_INPUT_ELEMENTS} elements per sample"
    return None


def _input_dtype(value: str) -> str | None:
    from planner.models.spec import INPUT_DTYPES

    return None if not value or value in INPUT_DTYPES else f"is not one of {', '.join(INPUT_DTYPES)}"


# Every metadata key pplan writes or reads, with its check (None: fine, else what is wrong).
# `edge` lines are parsed by planner.graph.edges.read_edges; an unknown key is refused with
# the nearest known one, so a typo (`seeed`) is not silently ignored.
META_KEYS: dict[str, Callable[[str], str | None]] = {
    "format": _free_text,  # compared with FORMAT below
    "model": _free_text,
    "seed": _integer(0, 2**63 - 1),
    "input_shape": _input_shape,
    "input_dtype": _input_dtype,
    "vocab": _integer(1, 2**31 - 1, empty_ok=True),
    "input_bytes_per_sample": _number(1e18),
    "device": _free_text,
    "device_name": _free_text,
    "dtype": _free_text,
    "torch": _free_text,
    "threads": _integer(0, 10**6),
    "date": _free_text,
    "command": _free_text,
    "warmup": _integer(0, 10**9),
    "repeats": _integer(0, 10**9),
    "elapsed_s": _number(1e9),
    "timer": _free_text,
    "source": _free_text,  # planner.partition.synthetic / planner.profiling.analytic: what made the profile
    "analytic": lambda v: None if v in ("true", "false") else "is not true or false",  # computed, not measured
    "hardware": _free_text,  # the hardware preset an analytic profile was computed for
}


@dataclass(frozen=True)
class LayerCosts:
    """Per-layer costs at one micro-batch size, as numpy arrays of length n_layers."""

    micro_batch_size: int
    """Samples per micro-batch these costs describe."""
    fwd_ms: np.ndarray
    """Forward time of each layer, ms."""
    bwd_ms: np.ndarray
    """Full backward time of each layer, ms."""
    bwd_input_ms: np.ndarray
    """Input-gradient half of the backward (zero-bubble I), ms."""
    bwd_weight_ms: np.ndarray
    """Weight-gradient half of the backward (zero-bubble W), ms."""
    optimizer_ms: np.ndarray
    """Optimizer step time for each layer's parameters, ms (0 when not measured)."""
    param_bytes: np.ndarray
    """Parameter bytes of each layer."""
    activation_bytes: np.ndarray
    """Bytes each layer keeps for its backward, per micro-batch."""
    output_bytes: np.ndarray
    """Bytes of each layer's output per micro-batch (what crosses a cut after it)."""
    input_bytes: float
    """Bytes of the model's input per micro-batch (0 when the profile does not say)."""
    interpolated: bool
    """True when micro_batch_size was not measured and these values are interpolated."""
    shared_input_bytes: np.ndarray | None = None
    """Bytes of each layer's saved input also saved by the layer before (count once within a stage)."""
    skip_edges: tuple = ()
    """Skip edges of a non-chain model (planner.graph.SkipEdge, bytes per sample); () for a chain."""
    crossing_bytes: np.ndarray | None = None
    """Length n_layers-1: bytes crossing the cut after each layer, skip tensors included (None: a chain, output_bytes[:-1])."""
    layer_input_bytes: np.ndarray | None = None
    """Per layer, bytes it reads from earlier layers (layer 0: input_bytes), what a checkpoint keeps (None: a chain)."""


@dataclass(frozen=True)
class Profile:
    """A validated profile: columns as (n_layers, n_sizes) arrays, sizes ascending."""

    names: tuple[str, ...]
    """Layer names, index = layer."""
    micro_batch_sizes: tuple[int, ...]
    """Measured micro-batch sizes, ascending."""
    columns: dict[str, np.ndarray]
    """Column name -> float array (n_layers, n_sizes); optional columns filled with defaults."""
    present: frozenset[str]
    """Which optional columns the file really had."""
    meta: dict[str, str] = field(default_factory=dict)
    """Leading `# key: value` metadata."""
    path: str | None = None
    """Where it was loaded from, if anywhere."""
    sha256: str | None = None
    """Checksum of the file's bytes (plans record it)."""
    skip_edges: tuple = ()
    """Skip edges from `# edge:` lines (planner.graph.SkipEdge); () for a chain."""

    @property
    def n_layers(self) -> int:
        return len(self.names)

    @property
    def input_bytes_per_sample(self) -> float:
        try:  # validated at load; a Profile built in code may hold anything
            return float(self.meta.get("input_bytes_per_sample", 0) or 0)
        except ValueError:
            return 0.0

    def at(self, micro_batch_size: int) -> LayerCosts:
        """Costs at `micro_batch_size`: exact rows if measured, else interpolated.

        Between measured sizes every column is linear in the size; beyond the largest (or
        below the smallest) times and bytes scale proportionally from the nearest measured
        size, which is what a layer does once it saturates the device.
        """
        if micro_batch_size < 1:
            raise ProfileError(f"micro-batch size {micro_batch_size} must be at least 1")
        interpolated = micro_batch_size not in self._position
        cols = {name: self._column_at(name, micro_batch_size) for name in (
            "fwd_ms", "bwd_ms", "bwd_input_ms", "bwd_weight_ms", "optimizer_ms",
            "activation_bytes", "output_bytes", "shared_input_bytes")}
        input_bytes = self.input_bytes_per_sample * micro_batch_size
        graph: dict = {}
        if self.skip_edges:  # a chain keeps exactly the arrays (and code path) it always had
            out, edges, n = cols["output_bytes"], self.skip_edges, self.n_layers
            graph = {"skip_edges": edges, "crossing_bytes": crossing_bytes(n, out, edges, micro_batch_size),
                     "layer_input_bytes": layer_inputs(n, out, edges, micro_batch_size, input_bytes)}
        return LayerCosts(
            micro_batch_size=micro_batch_size,
            param_bytes=self.columns["param_bytes"][:, 0].copy(),
            input_bytes=input_bytes,
            interpolated=interpolated,
            **cols,
            **graph,
        )

    @functools.cached_property
    def _position(self) -> dict[int, int]:
        """Measured size -> its column (a dict: constant-time lookups however many sizes)."""
        return {s: k for k, s in enumerate(self.micro_batch_sizes)}

    def _column_at(self, name: str, b: int) -> np.ndarray:
        data = self.columns[name]
        sizes = self.micro_batch_sizes
        if name == "optimizer_ms":  # independent of the micro-batch size
            return data[:, 0].copy()
        k = self._position.get(b)
        if k is not None:
            return data[:, k].copy()
        if b < sizes[0]:
            return data[:, 0] * (b / sizes[0])
        if b > sizes[-1]:
            return data[:, -1] * (b / sizes[-1])
        hi = bisect.bisect_right(sizes, b)
        lo = hi - 1
        w = (b - sizes[lo]) / (sizes[hi] - sizes[lo])
        return data[:, lo] * (1 - w) + data[:, hi] * w


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def load_profile(path: str | os.PathLike) -> Profile:
    """Read and validate a profile CSV; ProfileError names file, line and column on failure.

    The file is read with a bound (MAX_PROFILE_BYTES): a FIFO, a device such as /dev/zero or
    an oversized file is refused before anything is read.
    """
    p = Path(path)
    try:
        data = read_bounded_bytes(p, "profile", ProfileError, MAX_PROFILE_BYTES)
    except ProfileError as e:
        if "does not exist" in e.message:
            raise ProfileError(e.message, "run `pplan profile` or pick a file under profiles/") from None
        raise
    return profile_from_bytes(data, str(p))


def profile_from_bytes(data: bytes, source: str) -> Profile:
    """Validate the bytes of a profile file read elsewhere (so a caller that hashes them reads once)."""
    if b"\x00" in data[:4096]:
        raise ProfileError(f"{source}: not a text CSV file (binary data)", "give a profile written by `pplan profile`")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ProfileError(f"{source}: not UTF-8 text (byte {e.start})", "save the profile as UTF-8 CSV") from None
    return read_profile_text(text, source=source, sha256=_sha256(data))


def _read_meta(lines: list[str], source: str) -> tuple[dict[str, str], int]:
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
        problem = META_KEYS[key](value)
        if problem:
            raise ProfileError(f"{source}:{lineno}: metadata {key!r}: {value[:60]!r} {problem}")
        meta[key] = value
        where[key] = lineno
    return meta, first


def read_profile_text(text: str, source: str = "<profile>", sha256: str | None = None) -> Profile:
    """Parse and validate profile CSV text (see module docstring for the format).

    Linear in the size of the file, and every size it allocates is bounded by what the file
    holds: a layer index must be below the number of data rows (every layer needs a row), so
    one absurd index is refused at its line instead of allocating for it.
    """
    n_lines = text.count("\n") + 1
    if n_lines > 2 * MAX_ROWS:  # before splitting the text into that many strings
        raise ProfileError(f"{source}: {n_lines} lines, more than any profile has (at most {MAX_ROWS} data rows)",
                           f"a profile has one row per layer and micro-batch size: at most {MAX_LAYERS} layers")
    lines = text.splitlines()
    meta, first = _read_meta(lines, source)
    if first >= len(lines):
        raise ProfileError(f"{source}: empty profile (no header row)", "the first non-comment line must be the header: " + ",".join(REQUIRED_COLUMNS))
    fmt = meta.get("format")
    if fmt is not None and fmt != FORMAT:
        raise ProfileError(f"{source}: format {fmt!r} is not supported (this pplan reads {FORMAT})")
    reader = csv.reader(itertools.islice(lines, first, None))
    header = [h.strip() for h in next(reader)]
    have = set(header)
    missing = [c for c in REQUIRED_COLUMNS if c not in have]
    if missing:
        raise ProfileError(f"{source}:{first + 1}: missing column(s) {', '.join(missing)}", "the header needs " + ",".join(REQUIRED_COLUMNS))
    dupes = sorted(h for h, n in collections.Counter(header).items() if n > 1)
    if dupes:
        raise ProfileError(f"{source}:{first + 1}: duplicated column(s) {', '.join(dupes)}")
    index = {h: i for i, h in enumerate(header)}
    present = frozenset(c for c in OPTIONAL_COLUMNS if c in index)
    n_data = sum(1 for line in itertools.islice(lines, first + 1, None) if line.strip())
    if n_data > MAX_ROWS:
        raise ProfileError(f"{source}: {n_data} data rows, more than {MAX_ROWS}",
                           f"at most {MAX_LAYERS} layers; measure fewer micro-batch sizes")

    numeric = [(c, index[c]) for c in _NUMERIC if c in index]
    values: dict[str, array] = {c: array("d") for c, _ in numeric}
    row_layers, row_sizes, row_lines = array("q"), array("q"), array("q")
    names: dict[int, str] = {}
    i_layer, i_size, i_name, width = index["layer"], index["micro_batch_size"], index["name"], len(header)
    for row in reader:
        lineno = first + reader.line_num
        if not row or all(not cell.strip() for cell in row):
            continue
        if len(row) != width:
            raise ProfileError(f"{source}:{lineno}: {len(row)} fields, header has {width}", "the file may be truncated or a value contains a stray comma")
        layer = _int_cell(row[i_layer], source, lineno, "layer", minimum=0)
        if layer >= MAX_LAYERS:  # refused at its line; indices below are bounded by the row count after the loop
            if layer >= n_data:
                raise ProfileError(f"{source}:{lineno}: layer index {layer} is beyond the file's {n_data} data row(s) "
                                   f"(every layer has a row) and the limit of {MAX_LAYERS} layers", "layers are numbered 0..n-1")
            raise ProfileError(f"{source}:{lineno}: layer index {layer} means more than {MAX_LAYERS} layers",
                               "group layers into blocks before profiling; the planner is O(L^2) in layers")
        size = _int_cell(row[i_size], source, lineno, "micro_batch_size", minimum=1)
        if size > MAX_MICRO_BATCH_SIZE:
            raise ProfileError(f"{source}:{lineno}: column 'micro_batch_size': {size} is larger than any micro-batch (limit {MAX_MICRO_BATCH_SIZE})")
        name = row[i_name].strip()
        known = names.setdefault(layer, name)
        if known != name:
            raise ProfileError(f"{source}:{lineno}: layer {layer} is named {name!r} here but {known!r} earlier")
        for c, i in numeric:
            values[c].append(_num_cell(row[i], source, lineno, c))
        row_layers.append(layer)
        row_sizes.append(size)
        row_lines.append(lineno)
    if not row_layers:
        raise ProfileError(f"{source}: no data rows after the header")

    # Nothing above was sized by a layer index: a gap (which any index beyond the row count
    # implies, since every layer needs a row) is found in O(rows) before anything is.
    n_layers = max(names) + 1
    if len(names) < n_layers:
        gap = next(i for i in range(n_layers) if i not in names)
        after = next(k for k, layer in enumerate(row_layers) if layer > gap)
        beyond = f", and the file has {n_data} data row(s)" if n_layers > n_data else ""
        raise ProfileError(f"{source}:{row_lines[after]}: layer {row_layers[after]} but layer index {gap} is missing "
                           f"(layers must be 0..{n_layers - 1} without gaps{beyond})",
                           "every layer has a row for each micro-batch size")
    sizes = sorted(set(row_sizes))
    position = {s: k for k, s in enumerate(sizes)}
    lay = np.frombuffer(row_layers, dtype=np.int64)
    col = np.fromiter((position[s] for s in row_sizes), dtype=np.int64, count=len(row_sizes))
    _check_complete(lay, col, row_lines, sizes, names, source)

    columns: dict[str, np.ndarray] = {}
    for c in _NUMERIC:
        arr = np.zeros((n_layers, len(sizes)))
        if c in values:
            arr[lay, col] = np.frombuffer(values[c], dtype=float)
        columns[c] = arr
    pb = columns["param_bytes"]
    varies = np.flatnonzero(np.any(pb != pb[:, :1], axis=1))
    if varies.size:
        layer = int(varies[0])
        shown = ", ".join(f"{int(v)}" for v in np.unique(pb[layer]))
        raise ProfileError(f"{source}: layer {layer} has different param_bytes at different micro-batch sizes ({shown})", "parameter bytes do not depend on the batch")
    if "bwd_input_ms" not in present and "bwd_weight_ms" not in present:
        columns["bwd_input_ms"] = columns["bwd_ms"] / 2
        columns["bwd_weight_ms"] = columns["bwd_ms"] / 2
    elif "bwd_input_ms" not in present:
        columns["bwd_input_ms"] = np.maximum(columns["bwd_ms"] - columns["bwd_weight_ms"], 0)
    elif "bwd_weight_ms" not in present:
        columns["bwd_weight_ms"] = np.maximum(columns["bwd_ms"] - columns["bwd_input_ms"], 0)
    for arr in columns.values():
        arr.setflags(write=False)
    return Profile(
        names=tuple(names[i] for i in range(n_layers)),
        micro_batch_sizes=tuple(sizes),
        columns=columns,
        present=present,
        meta=meta,
        path=None if source.startswith("<") else source,
        sha256=sha256 or _sha256(text.encode("utf-8")),
        skip_edges=read_edges(lines, n_layers, source, max_bytes=_MAX_BYTES),
    )


def _check_complete(lay: np.ndarray, col: np.ndarray, row_lines: array, sizes: list[int], names: dict[int, str], source: str) -> None:
    """Every (layer, size) exactly once, checked in O(rows log rows) without a layers x sizes table."""
    n_layers, n_sizes = len(names), len(sizes)
    key = lay * n_sizes + col
    if np.unique(key).size < key.size:  # find the first repeat, in file order, for the message
        first_line: dict[int, int] = {}
        for k, line in zip(key.tolist(), row_lines):
            if k in first_line:
                layer, size = divmod(k, n_sizes)
                raise ProfileError(f"{source}:{line}: duplicate row for layer {layer} at micro_batch_size {sizes[size]} (first on line {first_line[k]})")
            first_line[k] = line
    if key.size != n_layers * n_sizes:
        counts = np.bincount(lay, minlength=n_layers)
        layer = int(np.flatnonzero(counts < n_sizes)[0])
        have = set(col[lay == layer].tolist())
        size = next(sizes[k] for k in range(n_sizes) if k not in have)
        raise ProfileError(f"{source}: layer {layer} ({names[layer]}) has no row for micro_batch_size {size}", "every layer needs every measured micro-batch size")


# Values beyond these describe no real device (11 days per layer, an exabyte) and would
# overflow the planner's and simulator's sums into inf: refuse them at the door, once.
_MAX_MS = 1e9
_MAX_BYTES = 1e18
_MAX_FLOPS = 1e24


def _num_limit(column: str) -> float:
    if column == "flops":
        return _MAX_FLOPS
    return _MAX_MS if column.endswith("_ms") or column.endswith("_std") else _MAX_BYTES


def _num_cell(cell: str, source: str, lineno: int, column: str) -> float:
    text = cell.strip()
    try:
        value = float(text)
    except ValueError:
        raise ProfileError(f"{source}:{lineno}: column {column!r}: {text!r} is not a number") from None
    if math.isnan(value) or math.isinf(value):
        raise ProfileError(f"{source}:{lineno}: column {column!r}: {text!r} is not a finite number")
    if value < 0:
        raise ProfileError(f"{source}:{lineno}: column {column!r}: {text!r} is negative", "times and bytes are >= 0")
    if value > _num_limit(column):
        unit = "ms" if _num_limit(column) == _MAX_MS else "bytes" if _num_limit(column) == _MAX_BYTES else "flops"
        raise ProfileError(f"{source}:{lineno}: column {column!r}: {text!r} is too large for any real device (limit {_num_limit(column):.0e} {unit})", "check the units: times in ms, sizes in bytes")
    return value


def _int_cell(cell: str, source: str, lineno: int, column: str, minimum: int) -> int:
    text = cell.strip()
    try:
        value = int(text)
    except ValueError:
        raise ProfileError(f"{source}:{lineno}: column {column!r}: {text!r} is not an integer") from None
    if value < minimum:
        raise ProfileError(f"{source}:{lineno}: column {column!r}: {value} is below {minimum}")
    return value


def _fmt(column: str, value: float) -> str:
    if column in _INTEGER:
        return str(int(round(value)))
    return f"{value:.6g}"


def profile_to_text(profile: Profile) -> str:
    """CSV text of `profile`: metadata lines, header, rows ordered by layer then size."""
    out = io.StringIO()
    meta = {"format": FORMAT, **{k: v for k, v in profile.meta.items() if k != "format"}}
    for key, value in meta.items():
        out.write(f"# {key}: {value}\n")
    for line in edge_lines(profile.skip_edges):  # none for a chain: its text is unchanged
        out.write(line + "\n")
    cols = list(REQUIRED_COLUMNS) + [c for c in OPTIONAL_COLUMNS if c in profile.present]
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(cols)
    for layer, name in enumerate(profile.names):
        for k, size in enumerate(profile.micro_batch_sizes):
            row = [str(layer), name, str(size)]
            row += [_fmt(c, profile.columns[c][layer, k]) for c in cols[3:]]
            writer.writerow(row)
    return out.getvalue()


def write_profile(profile: Profile, path: str | os.PathLike) -> str:
    """Write `profile` atomically to `path`; returns the sha256 of what was written."""
    text = profile_to_text(profile)
    atomic_write_text(path, text)
    return _sha256(text.encode("utf-8"))


def make_profile(
    names: list[str],
    micro_batch_sizes: list[int],
    columns: dict[str, np.ndarray],
    meta: dict[str, str] | None = None,
    skip_edges: tuple = (),
) -> Profile:
    """Build a Profile from arrays (n_layers, n_sizes), validated by a text round-trip.

    Used by the profiler and by tests; routing through the CSV reader keeps one validator.
    `skip_edges` (planner.graph.SkipEdge or (src, dst, bytes_per_sample[, also_to]) tuples)
    become `# edge:` lines.
    """
    present = frozenset(c for c in OPTIONAL_COLUMNS if c in columns)
    draft = Profile(
        names=tuple(names),
        micro_batch_sizes=tuple(micro_batch_sizes),
        columns={c: np.asarray(columns.get(c, np.zeros((len(names), len(micro_batch_sizes)))), dtype=float) for c in _NUMERIC},
        present=present,
        meta=dict(meta or {}),
        skip_edges=tuple(skip_edges),
    )
    return read_profile_text(profile_to_text(draft))


__all__ += ["make_profile", "profile_to_text"]
