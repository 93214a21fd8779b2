"""Baseline stage cuts the planner is compared with (each also a `--method`).

uniform  equal layer counts (the first L mod S stages get one layer more)
params   parameter-balanced: contiguous blocks minimising the largest block's parameter bytes
time     torchgpipe's balance_by_time idea: blocks minimising the largest fwd+bwd time

Balanced blocks are solved exactly (min-max contiguous partition into S non-empty blocks),
which is at least as balanced as torchgpipe's block-partition heuristic. None of them looks at
memory, communication or device speed; recompute sets are then chosen per stage by the same
policy as the planner's (planner.partition.recompute).
"""

from __future__ import annotations

import numpy as np

from planner.errors import PplanError

__all__ = ["BASELINES", "uniform_cuts", "balanced_cuts", "baseline_cuts"]

BASELINES = ("uniform", "params", "time")


def uniform_cuts(n_layers: int, n_stages: int) -> tuple[int, ...]:
    """Equal layer counts, the remainder spread over the first stages."""
    if not 1 <= n_stages <= n_layers:
        raise PplanError(f"cannot split {n_layers} layers into {n_stages} stages")
    base, extra = divmod(n_layers, n_stages)
    cuts = [0]
    for s in range(n_stages):
        cuts.append(cuts[-1] + base + (1 if s < extra else 0))
    return tuple(cuts)


def balanced_cuts(weights: np.ndarray, n_stages: int) -> tuple[int, ...]:
    """Contiguous non-empty blocks minimising the largest block sum (exact, O(L^2 S) vectorised).

    Among optimal partitions it keeps the most even one; ties go to the earliest cut (deterministic).
    """
    w = np.asarray(weights, dtype=float)
    L = len(w)
    if not 1 <= n_stages <= L:
        raise PplanError(f"cannot split {L} layers into {n_stages} stages")
    pre = np.concatenate([[0.0], np.cumsum(w)])
    idx = np.arange(L + 1)
    block = np.where(idx[None, :] > idx[:, None], pre[None, :] - pre[:, None], np.inf)
    cols = np.arange(L + 1)
    f = block[0].copy()
    for _ in range(1, n_stages):
        f = np.maximum(f[:, None], block).min(axis=0)
    # Many partitions share the optimal largest block; keep the most even one (least sum of
    # squares), as a person balancing by hand would.
    z = f[L] * (1 + 1e-12) + 1e-300
    sq = np.where(block <= z, block * block, np.inf)
    g = sq[0].copy()
    back = []
    for _ in range(1, n_stages):
        cand = g[:, None] + sq
        arg = cand.argmin(axis=0)
        g = cand[arg, cols]
        back.append(arg)
    cuts = [L]
    for arg in reversed(back):
        cuts.append(int(arg[cuts[-1]]))
    cuts.append(0)
    return tuple(reversed(cuts))


def baseline_cuts(method: str, n_stages: int, param_bytes: np.ndarray, fwd_bwd_ms: np.ndarray) -> tuple[int, ...]:
    """Cuts of baseline `method` for `n_stages` stages."""
    if method == "uniform":
        return uniform_cuts(len(param_bytes), n_stages)
    if method == "params":
        return balanced_cuts(param_bytes, n_stages)
    if method == "time":
        return balanced_cuts(fwd_bwd_ms, n_stages)
    raise PplanError(f"unknown baseline {method!r}", f"use one of {', '.join(BASELINES)}")
