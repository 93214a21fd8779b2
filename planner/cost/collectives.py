"""Collectives over a (D, P, T) layout's links: which link each kind of traffic uses, and ring times. Pure.

Ring algorithms (Patarasuk & Yuan 2009; what NCCL runs for large messages), on r ranks, n bytes,
link bandwidth bw (bytes/s per direction) and per-step latency a:
    all-reduce      2(r-1) a + 2(r-1)/r * n / bw
    all-gather      (r-1) a + (r-1)/r * n / bw      (n = the gathered size)
    reduce-scatter  (r-1) a + (r-1)/r * n / bw      (n = the size before scattering)

Placement (Narayanan et al. SC21, section 3.3): T innermost within a node, then pipeline
neighbours, then D outermost; a group uses the intra-node link when it fits in one node, else
the inter-node link (bandwidth per GPU).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from planner.errors import PplanError

__all__ = ["Link2", "Placement", "placement", "allreduce_ms", "allgather_ms", "reduce_scatter_ms"]


@dataclass(frozen=True)
class Link2:
    """One link class: bandwidth (bytes/s per direction) and latency per message step (ms)."""

    bandwidth: float
    """Bytes per second per direction."""
    latency_ms: float
    """Latency of one step of a collective, ms."""


@dataclass(frozen=True)
class Placement:
    """Which links each kind of traffic of a (D, P, T) layout uses."""

    tp: Link2
    """Tensor-parallel all-reduces (within a node)."""
    dp: Link2
    """Data-parallel gradient synchronisation."""
    pp: tuple[Link2, ...]
    """Per pipeline boundary s -> s+1 (length P-1)."""


def placement(dp: int, pp: int, tp: int, gpus_per_node: int, intra: Link2, inter: Link2) -> Placement:
    """Links of a layout: rank = t + T*(p + P*d), nodes of `gpus_per_node` consecutive ranks.

    T must divide gpus_per_node. Pipeline boundary s -> s+1 is intra-node when stages s and s+1
    share a node in every replica, else inter-node: the replicas step together, so the slowest
    replica's link is the one the iteration waits for. The data-parallel ring is intra-node only
    when all D*P*T ranks fit in one node (a ring is as slow as its slowest link).
    """
    if gpus_per_node % tp:
        raise PplanError(f"tensor-parallel size {tp} does not divide {gpus_per_node} GPUs per node",
                         "tensor parallelism stays within a node: use a divisor of the GPUs per node")
    pp_links = tuple(inter if _crosses_node(s, dp, pp, gpus_per_node // tp) else intra for s in range(pp - 1))
    return Placement(tp=intra, dp=intra if dp * pp * tp <= gpus_per_node else inter, pp=pp_links)


def _crosses_node(boundary: int, dp: int, pp: int, groups_per_node: int) -> bool:
    """Whether pipeline boundary `boundary` -> +1 crosses a node in any replica: a node holds
    `groups_per_node` whole tensor-parallel groups (group p + P*d = ranks T(p + P*d) ..), so stage
    p + 1 of replica d starts a node when p + 1 + P*d is a multiple of it; P*d mod groups_per_node
    repeats within groups_per_node replicas, so those are enough to look at, whatever D is."""
    return any((boundary + 1 + pp * d) % groups_per_node == 0 for d in range(min(dp, groups_per_node)))


def allreduce_ms(nbytes: Any, ranks: int, link: Link2) -> Any:
    """Ring all-reduce of `nbytes` over `ranks`: 2(r-1) latency + 2(r-1)/r * n / bw, ms (0 for r = 1)."""
    if ranks <= 1:
        return 0.0 * np.asarray(nbytes, dtype=float)
    r = float(ranks)
    return 2 * (r - 1) * link.latency_ms + 2 * (r - 1) / r * np.asarray(nbytes, dtype=float) / link.bandwidth * 1e3


def allgather_ms(nbytes: Any, ranks: int, link: Link2) -> Any:
    """Ring all-gather producing `nbytes` on each of `ranks`: (r-1) latency + (r-1)/r * n / bw, ms."""
    if ranks <= 1:
        return 0.0 * np.asarray(nbytes, dtype=float)
    r = float(ranks)
    return (r - 1) * link.latency_ms + (r - 1) / r * np.asarray(nbytes, dtype=float) / link.bandwidth * 1e3


reduce_scatter_ms = allgather_ms  # ring reduce-scatter of `nbytes` (before scattering): the same steps and bytes
