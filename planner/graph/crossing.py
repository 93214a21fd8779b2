"""What crosses a stage cut when the model is not a chain. Pure arithmetic (numpy, no torch).

Layers are numbered in the traced order 0..n-1; *cut c* (0 <= c <= n-2) sits after layer c.
Every tensor has one producer layer p and consumer layers C (all > p); let d = max(C).

- Hop by hop (the planner's model, and what a runtime that forwards activations
  stage to stage does): the tensor crosses cut c exactly when p <= c < d, and is sent once
  over every link it crosses, whatever the number of consumers beyond. So

      crossing[c] = output_bytes[c] + sum of bytes of skip edges with src <= c < dst

  where `output_bytes[c]` holds only the tensors layer c sends to layer c+1 alone (the
  chain edge) and the skip edges (planner.graph.edges) the rest. A stage [first, end)
  receives crossing[first-1] and sends crossing[end-1] per micro-batch; a skip tensor that
  passes a stage without being read there is held on it per micro-batch in flight
  (`passthrough_bytes`).
- Direct (what torch.distributed.pipelining's `pipeline()` stages do): the producer's stage
  sends the tensor once to every other stage that reads it, skipping the stages between
  (`direct_send_bytes`); nothing is held on the stages between.

All functions take bytes per micro-batch for `output_bytes` (LayerCosts.output_bytes) and
per sample for skip edges (the profile's unit), multiplied by `micro_batch_size`; with the
default micro_batch_size=1 and per-sample output bytes everything is per sample.
"""

from __future__ import annotations

import bisect
import functools
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from planner.errors import PplanError
from planner.graph.edges import SkipEdge, as_skip_edges

__all__ = ["crossing_bytes", "passthrough_bytes", "layer_input_bytes", "layer_inputs", "direct_send_bytes", "stage_ranges"]


def _checked(n_layers: int, skip_edges: Iterable[Sequence]) -> tuple[SkipEdge, ...]:
    edges = _edge_gaps(skip_edges).edges
    for e in edges:
        if e.dst >= n_layers:
            raise PplanError(f"skip edge {e.src}->{e.dst} points past the last layer {n_layers - 1}")
    return edges


def crossing_bytes(n_layers: int, output_bytes_per_layer: Sequence[float], skip_edges: Iterable[Sequence] = (),
                   micro_batch_size: int = 1) -> np.ndarray:
    """Bytes crossing cut c (after layer c) for c = 0..n_layers-2, hop by hop (module docstring).

    `output_bytes_per_layer` (length n_layers; the last entry is unused) are the chain bytes;
    skip edges are (src, dst, bytes_per_sample[, also_to]). For a chain (no skip edges) the
    result is output_bytes_per_layer[:-1]. O(n_layers + edges).
    """
    if n_layers < 1:
        raise PplanError(f"a model needs at least one layer, got n_layers={n_layers}")
    out = np.asarray(output_bytes_per_layer, dtype=float)
    if out.shape != (n_layers,):
        raise PplanError(f"output_bytes_per_layer has shape {out.shape}, expected ({n_layers},)")
    if np.any(out < 0) or not np.all(np.isfinite(out)):
        raise PplanError("output_bytes_per_layer must be finite and >= 0")
    # A difference array: an edge adds its bytes to cuts src..dst-1.
    diff = np.zeros(n_layers + 1)
    for e in _checked(n_layers, skip_edges):
        diff[e.src] += e.bytes_per_sample * micro_batch_size
        diff[e.dst] -= e.bytes_per_sample * micro_batch_size
    return out[:-1] + np.cumsum(diff)[: n_layers - 1]


def passthrough_bytes(first: int, end: int, skip_edges: Iterable[Sequence] = (), micro_batch_size: int = 1) -> float:
    """Bytes stage [first, end) holds per micro-batch in flight for tensors it only forwards.

    A skip edge passes through when it is produced before the stage (src < first), read
    after it (dst >= end) and read by no layer of the stage (also_to misses [first, end)).
    Tensors the stage both reads and forwards are not included: the layer that reads them
    accounts for them in its activation_bytes when it saves them for backward.
    One vectorised pass over the edges' gaps (`_EdgeGaps`), built once per edge set.
    """
    if not 0 <= first < end:
        raise PplanError(f"stage [{first}, {end}) is empty or negative")
    gaps = _edge_gaps(skip_edges)
    total = gaps.bytes[(gaps.after < first) & (gaps.before >= end)].sum()
    return float(int(total) * micro_batch_size)


def layer_input_bytes(layer: int, output_bytes_per_layer: Sequence[float], skip_edges: Iterable[Sequence] = (),
                      micro_batch_size: int = 1) -> float:
    """Bytes layer `layer` (>= 1) reads from earlier layers: what a checkpoint of it keeps.

    The chain bytes of layer-1 plus every skip edge that lists `layer` among its consumers
    (for a chain: output_bytes[layer-1]). Layer 0 reads the model input, which the profile gives
    as input_bytes_per_sample.
    """
    if not 1 <= layer < len(output_bytes_per_layer):
        raise PplanError(f"layer {layer} has no earlier layer to read from (layers 1..{len(output_bytes_per_layer) - 1})")
    skips = sum(e.bytes_per_sample for e in as_skip_edges(skip_edges) if layer in e.consumers)
    return float(output_bytes_per_layer[layer - 1]) + float(skips * micro_batch_size)


def layer_inputs(n_layers: int, output_bytes_per_layer: Sequence[float], skip_edges: Iterable[Sequence] = (),
                 micro_batch_size: int = 1, input_bytes: float = 0.0) -> np.ndarray:
    """`layer_input_bytes` of every layer as an array; layer 0 reads the model input, `input_bytes`.

    One pass over the edges' readers (O(n_layers + readers)), not one over every edge per layer.
    """
    edges = _edge_gaps(skip_edges).edges  # validated once per edge set, not once per call
    first_missing = max(1, len(output_bytes_per_layer))  # the first layer layer_input_bytes refuses
    if n_layers > first_missing:
        layer_input_bytes(first_missing, output_bytes_per_layer)
    reads = [0] * max(n_layers, 1)  # exact integer sums, as layer_input_bytes adds them
    for e in edges:
        for reader in e.consumers:
            if reader < n_layers:
                reads[reader] += e.bytes_per_sample
    return np.array([float(input_bytes)] + [float(output_bytes_per_layer[i - 1]) + float(reads[i] * micro_batch_size)
                                            for i in range(1, n_layers)])


@dataclass(frozen=True)
class _EdgeGaps:
    """Every skip edge split at its readers: gap k of an edge runs between consecutive points
    a < b of (src, readers...). A stage [first, end) holds the edge exactly when some gap has
    a < first and end <= b, and at most one gap of an edge can (gaps of an edge are disjoint),
    so the bytes it forwards are the sum over such gaps."""

    edges: tuple[SkipEdge, ...]
    """The edges as as_skip_edges validated and sorted them."""
    after: np.ndarray
    """a of each gap (int64)."""
    before: np.ndarray
    """b of each gap (int64)."""
    bytes: np.ndarray
    """The edge's bytes per sample for each gap: int64 while every sum fits, else Python ints."""


# Distinct edge sets in use at once: the profile's, and one scaled set per micro-batch size the
# search prices (planner.cost.scaled_skip_edges). At the edge bound (8 lines x 4,000 layers,
# readers bounded by planner.graph.edges) one entry, arrays and validated edges, measured 13 MB,
# so 8 entries stay near 100 MB.
_CACHED_EDGE_SETS = 8


def _edge_gaps(skip_edges: Iterable[Sequence]) -> _EdgeGaps:
    """The gaps of `skip_edges`, validated (as_skip_edges) and built once per distinct tuple.

    The same tuple object comes back on every stage a search prices (PartitionProblem's edges):
    an identity hit skips even hashing it (~5 ms at 32,000 edges). The memo holds the tuple
    itself, so its id cannot be reused by another object while the entry lives.
    """
    if not isinstance(skip_edges, tuple):
        return _build_gaps(skip_edges)
    hit = _by_identity.get(id(skip_edges))
    if hit is not None and hit[0] is skip_edges:
        return hit[1]
    # Only SkipEdges of immutable parts are keyed on (a list inside would be unhashable and
    # could change after caching); plain tuples are validated afresh each call.
    if not all(type(e) is SkipEdge for e in skip_edges):
        return _build_gaps(skip_edges)
    try:
        hash(skip_edges)
    except TypeError:  # a list in some also_to
        return _build_gaps(skip_edges)
    gaps = _cached_gaps(skip_edges)
    if len(_by_identity) >= _CACHED_EDGE_SETS:
        del _by_identity[next(iter(_by_identity))]  # the oldest
    _by_identity[id(skip_edges)] = (skip_edges, gaps)
    return gaps


_by_identity: dict[int, tuple[tuple, _EdgeGaps]] = {}


@functools.lru_cache(maxsize=_CACHED_EDGE_SETS)
def _cached_gaps(skip_edges: tuple) -> _EdgeGaps:
    return _build_gaps(skip_edges)


def _build_gaps(skip_edges: Iterable[Sequence]) -> _EdgeGaps:
    edges = as_skip_edges(skip_edges)
    after, before, weights = [], [], []
    for e in edges:
        points = (e.src,) + e.consumers
        after.extend(points[:-1])
        before.extend(points[1:])
        weights.extend([e.bytes_per_sample] * (len(points) - 1))
    # int64 sums are exact while the total of every weight fits; past that keep Python ints.
    dtype = np.int64 if sum(weights) < 2**63 else object
    return _EdgeGaps(edges, np.array(after, dtype=np.int64), np.array(before, dtype=np.int64), np.array(weights, dtype=dtype))


def stage_ranges(n_layers: int, cuts: Iterable[int]) -> list[tuple[int, int]]:
    """[first, end) of each stage for cuts after the given layers (ascending, 0..n_layers-2)."""
    cs = list(cuts)
    if cs != sorted(set(cs)) or any(not 0 <= c <= n_layers - 2 for c in cs):
        raise PplanError(f"cuts {cs} must be distinct, ascending layer indices in 0..{n_layers - 2}", "cut c places a stage boundary after layer c")
    bounds = [0] + [c + 1 for c in cs] + [n_layers]
    return list(zip(bounds[:-1], bounds[1:]))


def direct_send_bytes(n_layers: int, cuts: Iterable[int], output_bytes_per_layer: Sequence[float],
                      skip_edges: Iterable[Sequence] = (), micro_batch_size: int = 1) -> np.ndarray:
    """(S, S) matrix: bytes stage i sends stage j per micro-batch when producers send directly.

    This is how `torch.distributed.pipelining.pipeline()` stages communicate: each tensor
    goes once from its producer's stage to every other stage that reads it. Row sums are
    what a stage sends, column sums what it receives (forward; the backward sends the
    same bytes of gradients the other way). Needs the edges' `also_to` to be exact.
    """
    out = np.asarray(output_bytes_per_layer, dtype=float)
    if out.shape != (n_layers,):
        raise PplanError(f"output_bytes_per_layer has shape {out.shape}, expected ({n_layers},)")
    ranges = stage_ranges(n_layers, cuts)
    starts = [first for first, _ in ranges]

    def stage(layer: int) -> int:
        return bisect.bisect_right(starts, layer) - 1

    sends = np.zeros((len(ranges), len(ranges)))
    for _, end in ranges[:-1]:
        sends[stage(end - 1), stage(end)] += out[end - 1]
    for e in _checked(n_layers, skip_edges):
        src_stage = stage(e.src)
        for dst_stage in sorted({stage(c) for c in e.consumers} - {src_stage}):
            sends[src_stage, dst_stage] += e.bytes_per_sample * micro_batch_size
    return sends
