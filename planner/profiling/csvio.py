"""The profile CSV: parsing and validating its text into arrays, and writing it back.

One row per (layer, micro_batch_size) after optional `# key: value` metadata lines
(planner.profiling.metadata) and `# edge:` lines (planner.graph.edges); the module
planner.profiling.profile documents the format and builds the Profile type from what
`parse_profile_csv` returns. Every error names the file, line and column.
"""

from __future__ import annotations

import collections
import csv
import difflib
import io
import itertools
import math
from array import array
from dataclasses import dataclass, field

import numpy as np

from planner.errors import PplanError, ProfileError
from planner.graph.edges import edge_lines, read_edges
from planner.limits import MAX_LAYER_BYTES, MAX_LAYER_FLOPS, MAX_LAYER_MS
from planner.profiling.metadata import read_meta
from planner.profiling.split_times import complete_backward_split
from planner.textsafe import check_name
from planner.units import PLAIN_INTEGER_HINT, PLAIN_NUMBER_HINT, plain_float, plain_int

__all__ = [
    "FORMAT", "REQUIRED_COLUMNS", "OPTIONAL_COLUMNS", "NUMERIC_COLUMNS", "INTEGER_COLUMNS", "MAX_LAYERS", "MAX_ROWS",
    "MAX_MICRO_BATCH_SIZE", "MAX_LINE_CHARS", "ProfileTable", "parse_profile_csv", "profile_to_text", "check_line_lengths",
    "count_lines", "csv_rows", "MAX_INT_CHARS",
]

FORMAT = "pplan-profile/1"
REQUIRED_COLUMNS = (
    "layer", "name", "micro_batch_size", "fwd_ms", "bwd_ms",
    "param_bytes", "activation_bytes", "output_bytes",
)
OPTIONAL_COLUMNS = (
    "fwd_ms_std", "bwd_ms_std", "bwd_input_ms", "bwd_weight_ms",
    "optimizer_ms", "flops", "cuda_peak_bytes", "shared_input_bytes", "workspace_bytes",
    "output_saved_bytes", "optimizer_workspace_bytes", "input_saved_bytes", "wgrad_bytes", "checkpoint_extra_bytes",
    "w_workspace_bytes", "w_carry_bytes",
)
NUMERIC_COLUMNS = tuple(c for c in REQUIRED_COLUMNS + OPTIONAL_COLUMNS if c not in ("layer", "name", "micro_batch_size"))
INTEGER_COLUMNS = ("param_bytes", "activation_bytes", "output_bytes", "flops", "cuda_peak_bytes", "shared_input_bytes",
                   "workspace_bytes", "output_saved_bytes", "optimizer_workspace_bytes", "input_saved_bytes", "wgrad_bytes",
                   "checkpoint_extra_bytes", "w_workspace_bytes", "w_carry_bytes")
# What `pplan partition` plans in reasonable time and memory (docs/profile-format.md): on a
# 2-core, 24 GiB machine 4,000 layers at 4 sizes took 25 s of CPU and 1.5 GB with 4 devices,
# 52 s and 1.4 GB with 8; 5,000 layers already 2.2 GB and 142 s of wall time. Memory grows
# about as L^1.6, so 20,000 layers extrapolates to ~20 GB and well over 10 minutes: not
# plannable on such a machine. Group layers into blocks beyond this.
MAX_LAYERS = 4_000
# One row per (layer, micro-batch size): e.g. 4,000 layers at 250 sizes, or 50,000 sizes of
# 20 layers. Bounds what loading holds in memory (about 100 bytes per row) whatever the file says.
MAX_ROWS = 1_000_000
# No device trains a micro-batch of a billion samples; beyond it a size is a typo.
MAX_MICRO_BATCH_SIZE = 10**9
# Characters one line of a profile or timeline CSV may hold: far beyond the longest pplan writes (an
# `# edge:` line naming 4,000 consumers is ~20,000; a synthetic spec with per-layer lists, tens of
# thousands), and a few MB to split. Without it a 255 MiB comment line peaked at 1.4 GB of memory.
MAX_LINE_CHARS = 2**20
_MAX_GUESSED = 20  # unknown header columns the "did you mean" hint compares (9 us each with difflib)
# Characters an integer cell may hold: an int64 has 19 digits, and a longer cell is a typo or a
# hostile file whose 4,000-digit value would otherwise be parsed and printed in the error.
MAX_INT_CHARS = 24


@dataclass(frozen=True)
class ProfileTable:
    """What a profile CSV holds, validated: the Profile's fields before it is built."""

    names: tuple[str, ...]
    """Layer names, index = layer."""
    micro_batch_sizes: tuple[int, ...]
    """Measured micro-batch sizes, ascending."""
    columns: dict[str, np.ndarray]
    """Column name -> read-only float array (n_layers, n_sizes); optional columns filled with defaults."""
    present: frozenset[str]
    """Which optional columns the file really had."""
    meta: dict[str, str] = field(default_factory=dict)
    """Leading `# key: value` metadata."""
    skip_edges: tuple = ()
    """Skip edges from `# edge:` lines (planner.graph.SkipEdge); () for a chain."""


@dataclass
class _Rows:
    """The data rows as read, in file order (flat arrays: about 100 bytes a row)."""

    values: dict[str, array]
    layers: array
    sizes: array
    lines: array
    names: dict[int, str]


# What str.splitlines ends a line at besides \n (and \r\n as one).
_OTHER_BREAKS = "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"


def count_lines(text: str) -> int:
    """How many lines `text.splitlines()` makes (+1), counted without making them (256 MiB of \\r).
    A rare break is counted only once `in` (a fast memchr) finds it: counting is 10x slower."""
    n = text.count("\n") + 1
    for ch in _OTHER_BREAKS:
        if ch in text:
            n += text.count(ch) - (text.count("\r\n") if ch == "\r" else 0)
    return n


def check_line_lengths(text: str | bytes, source: str, error: type[PplanError], what: str = "profile") -> None:
    """Refuse a line longer than MAX_LINE_CHARS before `text` is split. Without copies, in
    len(text) / MAX_LINE_CHARS steps: each moves past the last \\n or \\r (the csv module's line
    ends) of the next MAX_LINE_CHARS + 1 characters; a window without one is a line too long.
    Bytes work too (a file's, checked before it is decoded into a second copy)."""
    nl, cr = ("\n", "\r") if isinstance(text, str) else (b"\n", b"\r")
    pos, window = 0, MAX_LINE_CHARS + 1
    while len(text) - pos >= window:
        end = pos + window
        last_break = max(text.rfind(nl, pos, end), text.rfind(cr, pos, end))
        if last_break < 0:
            lineno = max(text.count(nl, 0, pos), text.count(cr, 0, pos)) + 1  # \n, \r\n or \r-only files
            unit = "characters" if isinstance(text, str) else "bytes"
            raise error(f"{source}:{lineno}: line is longer than {MAX_LINE_CHARS:,} {unit}",
                        f"a {what} line is a comment, metadata or one row of short cells: is this a {what} CSV?")
        pos = last_break + 1


def csv_rows(reader: "csv._reader", first: int, source: str, error: type[PplanError]):
    """The rows of `reader`, with the csv module's own errors (a cell longer than its field limit,
    a NUL byte) raised as `error` naming the line (`first` lines come before the reader's)."""
    try:
        yield from reader
    except csv.Error as e:
        lineno = first + reader.line_num
        if "field limit" in str(e):
            raise error(f"{source}:{lineno}: a cell is longer than {csv.field_size_limit()} characters",
                        "a cell holds a name or a number: look for a quote (\") that is never closed") from None
        raise error(f"{source}:{lineno}: not readable as CSV ({e})", "save the file as UTF-8 CSV text") from None


def parse_profile_csv(text: str, source: str) -> ProfileTable:
    """Parse and validate profile CSV text; ProfileError names file, line and column.

    Linear in the size of the file, and every size it allocates is bounded by what the file
    holds: a layer index must be below the number of data rows (every layer needs a row), so
    one absurd index is refused at its line instead of allocating for it.
    """
    n_lines = count_lines(text)
    if n_lines > 2 * MAX_ROWS:  # before splitting the text into that many strings
        raise ProfileError(f"{source}: {n_lines} lines, more than any profile has (at most {MAX_ROWS} data rows)",
                           f"a profile has one row per layer and micro-batch size: at most {MAX_LAYERS} layers")
    check_line_lengths(text, source, ProfileError)  # before splitting and stripping a 255 MiB line
    lines = text.splitlines(keepends=True)  # a newline inside a quoted cell stays in it, to be refused
    meta, first = read_meta(lines, source)
    if first >= len(lines):
        raise ProfileError(f"{source}: empty profile (no header row)", "the first non-comment line must be the header: " + ",".join(REQUIRED_COLUMNS))
    fmt = meta.get("format")
    if fmt is not None and fmt != FORMAT:
        raise ProfileError(f"{source}: format {fmt[:60]!r} is not supported (this pplan reads {FORMAT})",
                           "profile the model again with this pplan (`pplan profile`), or use the pplan that wrote it")
    reader = csv.reader(itertools.islice(lines, first, None))
    index = _header([h.strip() for h in next(csv_rows(reader, first, source, ProfileError))], source, first + 1)
    present = frozenset(c for c in OPTIONAL_COLUMNS if c in index)
    n_data = sum(1 for line in itertools.islice(lines, first + 1, None) if line.strip())
    if n_data > MAX_ROWS:
        raise ProfileError(f"{source}: {n_data} data rows, more than {MAX_ROWS}",
                           f"at most {MAX_LAYERS} layers; measure fewer micro-batch sizes")
    rows = _read_rows(reader, index, first, n_data, source)
    n_layers = _check_layers(rows, n_data, source)
    sizes = sorted(set(rows.sizes))
    columns = _columns(rows, sizes, n_layers, source)
    names = tuple(rows.names[i] for i in range(n_layers))
    complete_backward_split(columns, present, names, sizes, source)
    for arr in columns.values():
        arr.setflags(write=False)
    return ProfileTable(
        names=names, micro_batch_sizes=tuple(sizes), columns=columns,
        present=present, meta=meta, skip_edges=read_edges(lines, n_layers, source, max_bytes=MAX_LAYER_BYTES),
    )


def _near(column: str, candidates: list[str]) -> str | None:
    """The candidate a misspelt column most likely meant; None unless it is close (a timeline's
    `end_ms` is not a typo of `fwd_ms`, a `fwd_mss` is)."""
    match = difflib.get_close_matches(column, candidates, n=1, cutoff=0.75)
    return match[0] if match else None


def _header(header: list[str], source: str, lineno: int) -> dict[str, int]:
    """Column name -> position, once every required column is there, none twice and none unknown.

    An unknown column is refused, not ignored: a misspelt optional column (`optimiser_ms`) would
    otherwise be dropped and its default used, silently changing every prediction."""
    have = set(header)
    known = REQUIRED_COLUMNS + OPTIONAL_COLUMNS
    unknown = [h for h in header if h not in known]
    missing = [c for c in REQUIRED_COLUMNS if c not in have]
    if missing:
        # the first few only: a header of 500,000 unknown columns would take seconds
        guesses = [f"{g!r} (the header has {u[:60]!r})" for u in unknown[:_MAX_GUESSED] if (g := _near(u, missing))]
        hint = f"did you mean {', '.join(guesses)}? " if guesses else ""
        raise ProfileError(f"{source}:{lineno}: missing column(s) {', '.join(missing)}",
                           hint + "the header needs " + ",".join(REQUIRED_COLUMNS))
    if unknown:
        guess = _near(unknown[0], [c for c in known if c not in have])
        raise ProfileError(f"{source}:{lineno}: unknown column {unknown[0][:60]!r}"
                           + (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""),
                           (f"did you mean {guess!r}? " if guess else "")
                           + "optional columns: " + ", ".join(OPTIONAL_COLUMNS) + " (docs/profile-format.md)")
    dupes = sorted(h for h, n in collections.Counter(header).items() if n > 1)
    if dupes:
        raise ProfileError(f"{source}:{lineno}: duplicated column(s) {', '.join(dupes)}", "keep one column of each name")
    return {h: i for i, h in enumerate(header)}


def _read_rows(reader: "csv._reader", index: dict[str, int], first: int, n_data: int, source: str) -> _Rows:
    """Every data row, each cell checked where it stands."""
    numeric = [(c, index[c], _num_limit(c)) for c in NUMERIC_COLUMNS if c in index]  # limits found once, not per cell
    rows = _Rows(values={c: array("d") for c, _, _ in numeric}, layers=array("q"), sizes=array("q"), lines=array("q"), names={})
    i_layer, i_size, i_name, width = index["layer"], index["micro_batch_size"], index["name"], len(index)
    for row in csv_rows(reader, first, source, ProfileError):
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
            raise ProfileError(f"{source}:{lineno}: column 'micro_batch_size': {size} is larger than any micro-batch (limit {MAX_MICRO_BATCH_SIZE})",
                               "micro_batch_size counts samples per micro-batch")
        _check_layer_name(rows.names, layer, row[i_name].strip(), source, lineno)
        for c, i, limit in numeric:
            rows.values[c].append(_num_cell(row[i], source, lineno, c, limit))
        rows.layers.append(layer)
        rows.sizes.append(size)
        rows.lines.append(lineno)
    if not rows.layers:
        raise ProfileError(f"{source}: no data rows after the header", "a profile has one row per layer and measured micro-batch size")
    return rows


def _check_layer_name(names: dict[int, str], layer: int, name: str, source: str, lineno: int) -> None:
    """Record `layer`'s name at its first row, once the terminal can show it (planner.textsafe:
    no escape sequence, newline or bidirectional override); its later rows must repeat it."""
    known = names.get(layer)
    if known is None:  # checked once per layer, not once per row
        names[layer] = check_name(name, "layer name", ProfileError, f"{source}:{lineno}")
    elif known != name:
        raise ProfileError(f"{source}:{lineno}: layer {layer} is named {name[:60]!r} here but {known!r} earlier",
                           "every row of a layer repeats its name")


def _check_layers(rows: _Rows, n_data: int, source: str) -> int:
    """The layer count, once layers are 0..n-1 without gaps.

    Nothing before was sized by a layer index: a gap (which any index beyond the row count
    implies, since every layer needs a row) is found in O(rows) before anything is.
    """
    n_layers = max(rows.names) + 1
    if len(rows.names) < n_layers:
        gap = next(i for i in range(n_layers) if i not in rows.names)
        after = next(k for k, layer in enumerate(rows.layers) if layer > gap)
        beyond = f", and the file has {n_data} data row(s)" if n_layers > n_data else ""
        raise ProfileError(f"{source}:{rows.lines[after]}: layer {rows.layers[after]} but layer index {gap} is missing "
                           f"(layers must be 0..{n_layers - 1} without gaps{beyond})",
                           "every layer has a row for each micro-batch size")
    return n_layers


def _columns(rows: _Rows, sizes: list[int], n_layers: int, source: str) -> dict[str, np.ndarray]:
    """Column -> (n_layers, n_sizes) array, once every (layer, size) has exactly one row."""
    position = {s: k for k, s in enumerate(sizes)}
    lay = np.frombuffer(rows.layers, dtype=np.int64)
    col = np.fromiter((position[s] for s in rows.sizes), dtype=np.int64, count=len(rows.sizes))
    _check_complete(lay, col, rows.lines, sizes, rows.names, source)
    columns: dict[str, np.ndarray] = {}
    for c in NUMERIC_COLUMNS:
        arr = np.zeros((n_layers, len(sizes)))
        if c in rows.values:
            arr[lay, col] = np.frombuffer(rows.values[c], dtype=float)
        columns[c] = arr
    pb = columns["param_bytes"]
    varies = np.flatnonzero(np.any(pb != pb[:, :1], axis=1))
    if varies.size:
        layer = int(varies[0])
        shown = ", ".join(f"{int(v)}" for v in np.unique(pb[layer]))
        raise ProfileError(f"{source}: layer {layer} has different param_bytes at different micro-batch sizes ({shown})", "parameter bytes do not depend on the batch")
    return columns


def _check_complete(lay: np.ndarray, col: np.ndarray, row_lines: array, sizes: list[int], names: dict[int, str], source: str) -> None:
    """Every (layer, size) exactly once, checked in O(rows log rows) without a layers x sizes table."""
    n_layers, n_sizes = len(names), len(sizes)
    key = lay * n_sizes + col
    if np.unique(key).size < key.size:  # find the first repeat, in file order, for the message
        first_line: dict[int, int] = {}
        for k, line in zip(key.tolist(), row_lines):
            if k in first_line:
                layer, size = divmod(k, n_sizes)
                raise ProfileError(f"{source}:{line}: duplicate row for layer {layer} at micro_batch_size {sizes[size]} (first on line {first_line[k]})",
                                   "keep one row per layer and micro-batch size")
            first_line[k] = line
    if key.size != n_layers * n_sizes:
        counts = np.bincount(lay, minlength=n_layers)
        layer = int(np.flatnonzero(counts < n_sizes)[0])
        have = set(col[lay == layer].tolist())
        size = next(sizes[k] for k in range(n_sizes) if k not in have)
        raise ProfileError(f"{source}: layer {layer} ({names[layer]}) has no row for micro_batch_size {size}", "every layer needs every measured micro-batch size")


def _num_limit(column: str) -> float:
    """planner.limits' bound on one layer's value in `column`: refused at the door, once."""
    if column == "flops":
        return MAX_LAYER_FLOPS
    return MAX_LAYER_MS if column.endswith("_ms") or column.endswith("_std") else MAX_LAYER_BYTES


def _cell_error(source: str, lineno: int, column: str, text: str, problem: str, hint: str | None = None) -> ProfileError:
    """The error for one cell, its text cut (a hostile cell may be 100,000 characters)."""
    shown = repr(text[:40]) + ("..." if len(text) > 40 else "")
    return ProfileError(f"{source}:{lineno}: column {column!r}: {shown} {problem}", hint)


def _num_cell(cell: str, source: str, lineno: int, column: str, limit: float) -> float:
    text = cell.strip()
    try:
        value = plain_float(text)
    except ValueError:
        raise _cell_error(source, lineno, column, text, "is not a number", PLAIN_NUMBER_HINT) from None
    if math.isnan(value) or math.isinf(value):  # 1e400 reads as inf
        raise _cell_error(source, lineno, column, text, "is not a finite number", "times and bytes are finite numbers >= 0")
    if value < 0:
        raise _cell_error(source, lineno, column, text, "is negative", "times and bytes are >= 0")
    if value > limit:
        unit = "ms" if limit == MAX_LAYER_MS else "bytes" if limit == MAX_LAYER_BYTES else "flops"
        raise _cell_error(source, lineno, column, text, f"is too large for any real device (limit {limit:.0e} {unit})",
                          "check the units: times in ms, sizes in bytes")
    return value


def _int_cell(cell: str, source: str, lineno: int, column: str, minimum: int) -> int:
    text = cell.strip()
    if len(text) > MAX_INT_CHARS:  # before parsing (and later printing) a 4,000-digit number
        raise _cell_error(source, lineno, column, text, f"is too long for an integer (more than {MAX_INT_CHARS} characters)", PLAIN_INTEGER_HINT)
    try:
        value = plain_int(text)
    except ValueError:
        raise _cell_error(source, lineno, column, text, "is not an integer", PLAIN_INTEGER_HINT) from None
    if value < minimum:
        raise ProfileError(f"{source}:{lineno}: column {column!r}: {value} is below {minimum}", f"{column} is at least {minimum}")
    return value


def _fmt(column: str, value: float) -> str:
    if column in INTEGER_COLUMNS:
        return str(int(round(value)))
    return f"{value:.6g}"


def profile_to_text(profile: ProfileTable) -> str:
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


