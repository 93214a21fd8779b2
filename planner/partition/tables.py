"""Per-(i, j) tables over a layer range, the DP's way of pricing every stage [i, j) at once.

Each is built from per-layer arrays with the same float operations as the scalar rule it tables,
so a DP entry equals what the cost model gives that one stage, bit for bit.
"""

from __future__ import annotations

import numpy as np

from planner.cost.held import running_i_parts

__all__ = ["prefix_sums", "range_max", "prefix_runmax", "running_i_table"]


def prefix_sums(x: np.ndarray) -> np.ndarray:
    """P[i] = sum x[:i] (L + 1 entries), so a stage [i, j) sums to P[j] - P[i]."""
    return np.concatenate([[0.0], np.cumsum(np.asarray(x, dtype=float))])


def range_max(a: np.ndarray) -> np.ndarray:
    """M[i, j] = max a[i:j] (0 when empty)."""
    L = len(a)
    out = np.zeros((L + 1, L + 1))
    for i in range(L):
        out[i, i + 1:] = np.maximum.accumulate(a[i:])
    return out


def prefix_runmax(a: np.ndarray) -> np.ndarray:
    """T[p, q] = max a[p:p+q] (0 for q = 0; beyond the end repeats the last value)."""
    n = len(a)
    out = np.zeros((n + 1, n + 1))
    for i in range(n):
        run = np.maximum.accumulate(a[i:])
        out[i, 1:n - i + 1] = run
        out[i, n - i + 1:] = run[-1]
    return out


def running_i_table(workspace: np.ndarray | None, wgrad: np.ndarray, work: np.ndarray | None) -> np.ndarray:
    """Per (i, j), planner.cost.held.running_i_extra of stage [i, j), the same floats: P[j] + max
    a[i:j] less the largest workspace (`work`, the range_max table; None: 0), at least 0; 0 where
    i = 0 (the first stage's I computes nothing) and where i >= j. Built in place: one (L+1)^2 table."""
    prefix, a, _ = running_i_parts(workspace, wgrad)
    L = len(a)
    table = np.full((L + 1, L + 1), -np.inf)
    for i in range(1, L):
        table[i, i + 1:] = np.maximum.accumulate(a[i:])
    table += prefix[None, :]
    if work is not None:
        table -= work
    return np.maximum(table, 0.0, out=table)
