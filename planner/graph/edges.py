"""Skip edges and their lines in the profile: `# edge: <src>-><consumers> <bytes_per_sample>`.

A *skip edge* is a tensor (or several merged tensors) that layer `src` produces and a layer
other than `src + 1` reads. One line per (producer, consumer set):

    # edge: 0->1,7 4096        <- layer 0 makes 4096 B/sample, read by layers 1 and 7
    # edge: 2->5 2048          <- layer 2 makes 2048 B/sample, read by layer 5 only

Consumers are listed ascending; the last is `dst`, the layer that reads it last, which is
what decides how far it travels. Tensors read only by `src + 1` are the chain edge: they stay
in the `output_bytes` column, so a chain model's profile has no edge lines at all.

The lines sit among the leading `# key: value` metadata of the profile CSV (the key `edge`
may repeat, so they cannot live in the metadata dict, which keeps one value per key).
`read_edges` parses and validates them with the line number; `edge_lines` writes them.
Pure Python: no torch, numpy or networkx.
"""

from __future__ import annotations

import math
import re
from typing import Iterable, NamedTuple, Sequence

from planner.errors import ProfileError
from planner.units import PLAIN_NUMBER_HINT, plain_float, plain_int

__all__ = ["EDGE_KEY", "MAX_EDGES_PER_LAYER", "MAX_READERS_PER_LAYER", "SkipEdge", "as_skip_edges", "edge_lines", "format_edge", "read_edges", "add_edge_lines"]

EDGE_KEY = "edge"
# A real model has a few skip tensors per layer (a U-Net one per resolution, a DenseNet block
# one per layer, its consumers merged on one line); the planner's costs grow with the edge
# count, so a profile may hold at most this many edge lines per layer.
MAX_EDGES_PER_LAYER = 8
# Readers over all edge lines, per layer. Each reader splits an edge into one more gap, and the
# planner walks every gap per search problem (planner.partition.problem.passthrough_table) and
# per stage it prices (planner.graph.crossing). Real models stay far below: a DenseNet block of
# k layers averages k/2 readers a layer (24 for DenseNet-201's largest), a tensor every block reads
# (an attention mask) adds one. Measured at 4,000 layers, 8 edge lines a layer (`pplan partition
# -n 4`): 63 readers a layer took 114 s of CPU, one reader a line 106 s, the chain 84 s. Without
# the bound a 256 MB profile could list ~50 million readers.
MAX_READERS_PER_LAYER = 64
_LINE = re.compile(r"^\s*(\S+?)\s*->\s*(\S+?)\s+(\S+)\s*$")


class SkipEdge(NamedTuple):
    """Tensors produced by layer `src` and read by layers beyond `src + 1` (per sample)."""

    src: int
    """Layer that produces the tensor(s)."""
    dst: int
    """The last layer that reads them (> src + 1)."""
    bytes_per_sample: int
    """Their bytes per sample (multiply by the micro-batch size)."""
    also_to: tuple[int, ...] = ()
    """Earlier layers (src < layer < dst, ascending) that read them too."""

    @property
    def consumers(self) -> tuple[int, ...]:
        """Every layer that reads the tensor(s), ascending, `dst` last."""
        return self.also_to + (self.dst,)


def as_skip_edges(edges: Iterable[Sequence]) -> tuple[SkipEdge, ...]:
    """SkipEdges from SkipEdges or plain (src, dst, bytes[, also_to]) tuples, checked and sorted.

    Raises ProfileError (one line, with the values) on src >= dst, src < 0, negative or
    non-finite bytes, or also_to outside (src, dst).
    """
    out = []
    for e in edges:
        if len(e) not in (3, 4):
            raise ProfileError(f"skip edge {tuple(e)!r} is not (src, dst, bytes_per_sample[, also_to])")
        src, dst, nbytes = int(e[0]), int(e[1]), float(e[2])
        also = tuple(sorted({int(c) for c in e[3]})) if len(e) == 4 else ()
        _check(src, dst, nbytes, also, None, f"skip edge {src}->{dst}")
        out.append(SkipEdge(src, dst, int(round(nbytes)), also))
    return tuple(sorted(out))


def format_edge(edge: SkipEdge) -> str:
    """The value part of one line: '0->1,7 4096'."""
    return f"{edge.src}->{','.join(map(str, edge.consumers))} {int(edge.bytes_per_sample)}"


def edge_lines(edges: Iterable[Sequence]) -> list[str]:
    """Metadata lines (no newline) for `edges`, sorted; [] for a chain model."""
    return [f"# {EDGE_KEY}: {format_edge(e)}" for e in as_skip_edges(edges)]


def _check(src: int, dst: int, nbytes: float, also: tuple[int, ...], n_layers: int | None, where: str) -> None:
    if src < 0:
        raise ProfileError(f"{where}: source layer {src} is negative", "layers are numbered from 0")
    if dst <= src:
        raise ProfileError(f"{where}: source layer {src} >= destination layer {dst}", "a tensor flows to a later layer: write src->dst with src < dst")
    if dst == src + 1:
        raise ProfileError(f"{where}: {src}->{dst} is the chain edge", f"count it in output_bytes of layer {src} instead of an edge line")
    if n_layers is not None and dst >= n_layers:
        raise ProfileError(f"{where}: destination layer {dst} is out of range (the profile has layers 0..{n_layers - 1})")
    if any(not src < c < dst for c in also):
        raise ProfileError(f"{where}: consumer layers {list(also) + [dst]} must lie after {src}, ascending, the last one the largest")
    if not math.isfinite(nbytes) or nbytes < 0:
        raise ProfileError(f"{where}: bytes_per_sample {nbytes!r} is negative or not finite", "give the tensor's bytes per sample, >= 0")


def _parse(value: str, lineno: int, source: str, n_layers: int | None) -> SkipEdge:
    where = f"{source}:{lineno}: edge {value.strip()!r}"
    m = _LINE.match(value)
    if not m:
        raise ProfileError(f"{where} does not read as <src>-><dst>[,<dst>...] <bytes_per_sample>", "e.g. `# edge: 0->1,7 4096`")
    try:
        src = plain_int(m.group(1))
        consumers = [plain_int(c) for c in m.group(2).split(",")]
    except ValueError:
        raise ProfileError(f"{where}: layers must be integers", "e.g. `# edge: 0->1,7 4096`") from None
    try:
        nbytes = plain_float(m.group(3))
    except ValueError:
        raise ProfileError(f"{where}: bytes_per_sample {m.group(3)!r} is not a number", PLAIN_NUMBER_HINT) from None
    if consumers != sorted(set(consumers)):
        raise ProfileError(f"{where}: consumer layers {consumers} must be ascending without repeats")
    _check(src, consumers[-1], nbytes, tuple(consumers[:-1]), n_layers, where)
    if nbytes != int(nbytes):
        raise ProfileError(f"{where}: bytes_per_sample {m.group(3)!r} is not a whole number of bytes")
    return SkipEdge(src, consumers[-1], int(nbytes), tuple(consumers[:-1]))


def _leading(lines: list[str]) -> Iterable[tuple[int, str, str]]:
    """(1-based line number, key, value) of the leading `# key: value` block, as profile.py reads it."""
    for i, line in enumerate(lines):
        if not (line.startswith("#") or not line.strip()):
            return
        body = line.lstrip("#").strip()
        if ":" in body:
            key, value = body.split(":", 1)
            yield i + 1, key.strip(), value


def _check_counts(lines_before: int, readers_before: int, value: str, n_layers: int | None, where: str) -> None:
    """Refuse the line that would pass the edge-line or reader bound, before its readers are split."""
    if n_layers is None:
        return
    limit = MAX_EDGES_PER_LAYER * n_layers
    if lines_before >= limit:
        raise ProfileError(f"{where}: more than {limit} edge lines for {n_layers} layers "
                           f"(at most {MAX_EDGES_PER_LAYER} per layer)", "merge the consumers of one tensor on one line: `# edge: 0->3,5,7 4096`")
    readers, reader_limit = value.count(",") + 1, MAX_READERS_PER_LAYER * n_layers
    if readers_before + readers > reader_limit:
        raise ProfileError(f"{where}: {readers_before + readers} readers on the edge lines so far, more than {reader_limit} "
                           f"for {n_layers} layers (at most {MAX_READERS_PER_LAYER} per layer)",
                           "list only the layers that read a tensor, or group layers into blocks")


def read_edges(text: str | Sequence[str], n_layers: int | None = None, source: str = "<profile>",
               max_bytes: float | None = None) -> tuple[SkipEdge, ...]:
    """Parse and validate the `# edge:` lines of a profile's leading metadata block.

    `text` is the whole profile text (or its lines). With `n_layers` the destinations are
    range-checked. Raises ProfileError naming `source`, the line number and the bad value on
    a malformed line, src >= dst, a layer out of range, negative bytes, bytes above
    `max_bytes` (a size no real device has: the profile's column limit), a repeated
    (src, consumers) pair, or (with `n_layers`) more than MAX_EDGES_PER_LAYER lines or
    MAX_READERS_PER_LAYER readers per layer. Linear in the lines. Returns the edges sorted by
    (src, dst).
    """
    lines = text.splitlines() if isinstance(text, str) else list(text)
    seen: dict[tuple[int, tuple[int, ...]], int] = {}
    out = []
    readers = 0
    for lineno, key, value in _leading(lines):
        if key != EDGE_KEY:
            continue
        _check_counts(len(out), readers, value, n_layers, f"{source}:{lineno}")
        edge = _parse(value, lineno, source, n_layers)
        readers += len(edge.consumers)
        if max_bytes is not None and edge.bytes_per_sample > max_bytes:
            raise ProfileError(f"{source}:{lineno}: edge {format_edge(edge)!r}: {edge.bytes_per_sample} bytes per sample is too large for any real device (limit {max_bytes:.0e} bytes)",
                               "check the units: sizes in bytes")
        ident = (edge.src, edge.consumers)
        if ident in seen:
            raise ProfileError(f"{source}:{lineno}: edge {format_edge(edge)!r} repeats {edge.src}->{','.join(map(str, edge.consumers))} (first on line {seen[ident]})", "add the bytes into one line")
        seen[ident] = lineno
        out.append(edge)
    return tuple(sorted(out))


def add_edge_lines(profile_text: str, edges: Iterable[Sequence]) -> str:
    """`profile_text` with `edges` written at the end of its leading metadata block.

    Existing edge lines are replaced; with no edges the result equals the input minus any
    old edge lines (a chain profile comes back byte for byte).
    """
    lines = profile_text.splitlines(keepends=True)
    head = 0
    while head < len(lines) and (lines[head].startswith("#") or not lines[head].strip()):
        head += 1
    kept = [ln for ln in lines[:head] if not any(k == EDGE_KEY for _, k, _ in _leading([ln]))]
    new = [ln + "\n" for ln in edge_lines(edges)]
    return "".join(kept + new + lines[head:])
