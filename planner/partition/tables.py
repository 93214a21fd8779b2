"""Per-(i, j) tables over a layer range, the DP's way of pricing every stage [i, j) at once.

Each is built from per-layer arrays with the same float operations as the scalar rule it tables,
so a DP entry equals what the cost model gives that one stage, bit for bit.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from planner.cost.held import running_i_parts

__all__ = ["prefix_sums", "range_max", "prefix_runmax", "running_i_table", "w_workspace_table", "split_backward_tables"]


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


def w_workspace_table(workspace: np.ndarray, carry: np.ndarray | None) -> np.ndarray:
    """(L+1, L+1) table whose [i, j] is planner.cost.w_workspace.stage_w_workspace(workspace, carry, i, j) for every i < j,
    the same floats (0 elsewhere): per start, the running max of each layer's workspace plus the
    carry of the nearest earlier layer of the stage with one."""
    ws = np.asarray(workspace, dtype=float)
    L = len(ws)
    c = np.zeros(L) if carry is None else np.asarray(carry, dtype=float)
    out = np.zeros((L + 1, L + 1))
    # per layer, the nearest earlier layer with a carry (-1: none); a stage starting at i holds it if it is >= i
    with_carry = np.where(c > 0, np.arange(L), -1)
    prev = np.concatenate([[-1], np.maximum.accumulate(with_carry)[:-1]])
    carried = c[np.maximum(prev, 0)]
    for i in range(1, L):
        held = np.where(prev[i:] >= i, carried[i:], 0.0)
        out[i, i + 1:] = np.maximum.accumulate(np.maximum(ws[i:] + held, 0.0))
    return out


def split_backward_tables(wgrad: np.ndarray | None, workspace: np.ndarray | None, work: np.ndarray | None,
                          w_workspace: np.ndarray | None, w_carry: np.ndarray | None) -> tuple[Any, Any, Any]:
    """The DP's split-backward tables, each None without its columns: prefix sums of wgrad (what a
    stage holds between a micro-batch's I and W), running_i_table (what a running I holds beyond
    the transient) and w_workspace_table (what a running W holds beyond the gradients)."""
    pw, running = (prefix_sums(wgrad), running_i_table(workspace, wgrad, work)) if wgrad is not None else (None, None)
    return pw, running, (w_workspace_table(w_workspace, w_carry) if w_workspace is not None else None)
