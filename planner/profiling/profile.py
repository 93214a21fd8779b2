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

import csv
import hashlib
import io
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from planner.atomic import atomic_write_text
from planner.errors import ProfileError
from planner.graph.crossing import crossing_bytes, layer_inputs
from planner.graph.edges import EDGE_KEY, edge_lines, read_edges

__all__ = [
    "FORMAT",
    "REQUIRED_COLUMNS",
    "OPTIONAL_COLUMNS",
    "MAX_LAYERS",
    "LayerCosts",
    "Profile",
    "load_profile",
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
# Beyond this a profile is almost certainly a mistake (or a generator gone wrong), and the
# planner's O(L^2 * S) search would run for hours: refuse with a hint instead.
MAX_LAYERS = 20_000


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
        try:
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
        sizes = self.micro_batch_sizes
        interpolated = micro_batch_size not in sizes
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

    def _column_at(self, name: str, b: int) -> np.ndarray:
        data = self.columns[name]
        sizes = self.micro_batch_sizes
        if name == "optimizer_ms":  # independent of the micro-batch size
            return data[:, 0].copy()
        if b in sizes:
            return data[:, sizes.index(b)].copy()
        if b < sizes[0]:
            return data[:, 0] * (b / sizes[0])
        if b > sizes[-1]:
            return data[:, -1] * (b / sizes[-1])
        hi = next(i for i, s in enumerate(sizes) if s > b)
        lo = hi - 1
        w = (b - sizes[lo]) / (sizes[hi] - sizes[lo])
        return data[:, lo] * (1 - w) + data[:, hi] * w


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def load_profile(path: str | os.PathLike) -> Profile:
    """Read and validate a profile CSV; ProfileError names file, line and column on failure."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise ProfileError(f"profile {str(p)!r} does not exist", "run `pplan profile` or pick a file under profiles/") from None
    except IsADirectoryError:
        raise ProfileError(f"profile {str(p)!r} is a directory, not a CSV file") from None
    except OSError as e:
        raise ProfileError(f"cannot read profile {str(p)!r}: {e.strerror}") from None
    if b"\x00" in data[:4096]:
        raise ProfileError(f"{p}: not a text CSV file (binary data)", "give a profile written by `pplan profile`")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ProfileError(f"{p}: not UTF-8 text (byte {e.start})", "save the profile as UTF-8 CSV") from None
    return read_profile_text(text, source=str(p), sha256=_sha256(data))


def read_profile_text(text: str, source: str = "<profile>", sha256: str | None = None) -> Profile:
    """Parse and validate profile CSV text (see module docstring for the format)."""
    lines = text.splitlines()
    meta: dict[str, str] = {}
    first = 0
    while first < len(lines) and (lines[first].startswith("#") or not lines[first].strip()):
        line = lines[first].lstrip("#").strip()
        if ":" in line:
            key, value = line.split(":", 1)
            if key.strip() != EDGE_KEY:  # repeated edge lines are parsed by read_edges below
                meta[key.strip()] = value.strip()
        first += 1
    if first >= len(lines):
        raise ProfileError(f"{source}: empty profile (no header row)", "the first non-comment line must be the header: " + ",".join(REQUIRED_COLUMNS))
    fmt = meta.get("format")
    if fmt is not None and fmt != FORMAT:
        raise ProfileError(f"{source}: format {fmt!r} is not supported (this pplan reads {FORMAT})")
    reader = csv.reader(io.StringIO("\n".join(lines[first:])))
    header = [h.strip() for h in next(reader)]
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        raise ProfileError(f"{source}:{first + 1}: missing column(s) {', '.join(missing)}", "the header needs " + ",".join(REQUIRED_COLUMNS))
    dupes = sorted({h for h in header if header.count(h) > 1})
    if dupes:
        raise ProfileError(f"{source}:{first + 1}: duplicated column(s) {', '.join(dupes)}")
    index = {h: i for i, h in enumerate(header)}
    present = frozenset(c for c in OPTIONAL_COLUMNS if c in index)

    rows: dict[tuple[int, int], tuple[int, dict[str, float]]] = {}
    names: dict[int, str] = {}
    for offset, row in enumerate(reader):
        lineno = first + 2 + offset
        if not row or all(not cell.strip() for cell in row):
            continue
        if len(row) != len(header):
            raise ProfileError(f"{source}:{lineno}: {len(row)} fields, header has {len(header)}", "the file may be truncated or a value contains a stray comma")
        layer = _int_cell(row[index["layer"]], source, lineno, "layer", minimum=0)
        size = _int_cell(row[index["micro_batch_size"]], source, lineno, "micro_batch_size", minimum=1)
        name = row[index["name"]].strip()
        if layer in names and names[layer] != name:
            raise ProfileError(f"{source}:{lineno}: layer {layer} is named {name!r} here but {names[layer]!r} earlier")
        names[layer] = name
        values = {c: _num_cell(row[index[c]], source, lineno, c) for c in _NUMERIC if c in index}
        if (layer, size) in rows:
            raise ProfileError(f"{source}:{lineno}: duplicate row for layer {layer} at micro_batch_size {size} (first on line {rows[(layer, size)][0]})")
        rows[(layer, size)] = (lineno, values)
        if len(names) > MAX_LAYERS:
            raise ProfileError(f"{source}: more than {MAX_LAYERS} layers", "group layers into blocks before profiling; the planner is O(L^2) in layers")
    if not rows:
        raise ProfileError(f"{source}: no data rows after the header")

    n_layers = max(names) + 1
    gaps = [i for i in range(n_layers) if i not in names]
    if gaps:
        raise ProfileError(f"{source}: layer index {gaps[0]} is missing (layers must be 0..{n_layers - 1} without gaps)")
    sizes = sorted({s for (_, s) in rows})
    for layer in range(n_layers):
        for s in sizes:
            if (layer, s) not in rows:
                raise ProfileError(f"{source}: layer {layer} ({names[layer]}) has no row for micro_batch_size {s}", "every layer needs every measured micro-batch size")

    columns: dict[str, np.ndarray] = {}
    for c in _NUMERIC:
        arr = np.zeros((n_layers, len(sizes)))
        if c in index:
            for (layer, s), (_, values) in rows.items():
                arr[layer, sizes.index(s)] = values[c]
        columns[c] = arr
    for layer in range(n_layers):
        pb = {columns["param_bytes"][layer, k] for k in range(len(sizes))}
        if len(pb) > 1:
            raise ProfileError(f"{source}: layer {layer} has different param_bytes at different micro-batch sizes ({', '.join(f'{int(v)}' for v in sorted(pb))})", "parameter bytes do not depend on the batch")
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
