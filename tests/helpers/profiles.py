"""Profiles written for tests: CSV text from rows, and random profiles (with or without skip edges)."""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from planner.graph import SkipEdge
from planner.profiling.profile import make_profile

COLUMNS = "layer,name,micro_batch_size,fwd_ms,bwd_ms,param_bytes,activation_bytes,output_bytes"
"""The required columns of a profile CSV, in the order pplan writes them."""

SIZES = [1, 2, 4]
"""The micro-batch sizes of a random profile."""


def profile_csv(meta: dict[str, Any], rows: Iterable[str | Iterable[Any]]) -> str:
    """The text of a pplan-profile/1 CSV: the format line, `# key: value` lines, the header, one line a
    row (a row is its CSV line, or its values)."""
    lines = ["# format: pplan-profile/1", *(f"# {k}: {v}" for k, v in meta.items()), COLUMNS]
    lines += [row if isinstance(row, str) else ",".join(map(str, row)) for row in rows]
    return "\n".join(lines) + "\n"


def random_edges(rng: np.random.Generator, n_layers: int, scale: float = 1.0, max_edges: int = 3) -> tuple[SkipEdge, ...]:
    """Up to max_edges skip tensors with random producers, readers and bytes per sample."""
    edges: dict[tuple, SkipEdge] = {}
    for _ in range(int(rng.integers(0, max_edges + 1))):
        if n_layers < 3:
            break
        src = int(rng.integers(0, n_layers - 2))
        dst = int(rng.integers(src + 2, n_layers))
        mids = tuple(c for c in range(src + 1, dst) if rng.random() < 0.3)
        edges[(src, mids + (dst,))] = SkipEdge(src, dst, int(rng.integers(1, 40) * scale), mids)
    return tuple(sorted(edges.values()))


def random_profile(rng: np.random.Generator, n_layers: int, skip_edges: bool = False):
    """A random profile at micro-batch sizes 1, 2 and 4; with `skip_edges`, up to four random skip
    tensors (drawn after the columns, bytes comparable to the chain outputs)."""
    b = np.array(SIZES, dtype=float)[None, :]
    per = lambda lo, hi: rng.uniform(lo, hi, (n_layers, 1))  # noqa: E731
    fwd = per(0.1, 2.0) * (b + rng.uniform(0, 2))
    cols = {
        "fwd_ms": np.round(fwd, 4), "bwd_ms": np.round(fwd * rng.uniform(1.5, 2.5), 4),
        "param_bytes": np.repeat(np.round(per(1e5, 5e7)), 3, axis=1),
        "activation_bytes": np.round(per(1e5, 3e7) * b), "output_bytes": np.round(per(1e4, 3e6) * b),
    }
    edges = random_edges(rng, n_layers, scale=1e5, max_edges=4) if skip_edges else ()
    return make_profile([f"l{i}" for i in range(n_layers)], SIZES, cols, {"input_bytes_per_sample": "1000", "seed": "3"}, skip_edges=edges)
