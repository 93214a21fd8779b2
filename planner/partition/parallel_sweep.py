"""Throughput of every dp x pp x tp layout of a cluster, for the layout figure.

The 3D search keeps only its best few candidates; this asks it once per layout (forced, so
each layout gets its own best micro-batch size, schedule and recompute). A layout where nothing
fits is asked again with the memory limit lifted, so the figure can show, hollow, what it
would reach if it fitted. A layout that cannot run at all (its replicas do not split the batch,
the schedules and micro-batch count the search is held to do not run on it, or `pplan run`
cannot execute it for the profile's model: planner.partition.parallel_runnable) has no point.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence

from planner.errors import InfeasibleError, ScheduleError
from planner.parallel import ParallelConfig
from planner.partition.parallel_runnable import layout_refusal
from planner.partition.parallel_search import candidate_layouts, plan_parallel

__all__ = ["LayoutPoint", "layout_sweep"]

_UNLIMITED = 2**60  # bytes: "memory lifted" for the hollow points


@dataclass(frozen=True)
class LayoutPoint:
    """The best plan of one layout."""

    config: ParallelConfig
    """dp, pp, tp and ZeRO stage."""
    tflops_per_gpu: float | None
    """Achieved TFLOP/s per GPU of its best plan (with memory lifted when it does not fit; None: not even then)."""
    fits: bool
    """Its best plan fits the GPU's memory."""


def layout_sweep(profile: Any, *, hardware: Any, nodes: int, gpus_per_node: int, global_batch: int, zero: int = 0,
                 recompute: str = "auto", memory_bytes: int | None = None, schedules: Sequence[str] | None = None,
                 microbatches: int | None = None, overlap_grad_sync: bool = False) -> tuple[LayoutPoint, ...]:
    """One LayoutPoint per layout candidate_layouts gives for nodes x gpus_per_node GPUs, searched
    as plan_parallel searches (`schedules`, `microbatches`: what it is held to; None: all;
    `overlap_grad_sync`: how the gradient sync is priced)."""
    points = []
    common = dict(hardware=hardware, nodes=nodes, gpus_per_node=gpus_per_node, global_batch=global_batch,
                  recompute=recompute, schedules=schedules, microbatches=microbatches, overlap_grad_sync=overlap_grad_sync)
    for cfg in candidate_layouts(nodes * gpus_per_node, gpus_per_node, profile.n_layers):
        cfg = replace(cfg, zero=zero)
        if global_batch % cfg.dp or layout_refusal(cfg, profile.meta.get("model")):  # no batch split, or pplan run cannot run it
            points.append(LayoutPoint(cfg, None, False))
            continue
        try:
            best = plan_parallel(profile, parallel=cfg, memory_bytes=memory_bytes, top_k=1, check_hints=False, **common).best
            points.append(LayoutPoint(cfg, best.tflops_per_gpu, True))
            continue
        except ScheduleError:  # the held schedules or micro-batch count do not run on it
            points.append(LayoutPoint(cfg, None, False))
            continue
        except InfeasibleError:
            pass
        try:
            best = plan_parallel(profile, parallel=cfg, memory_bytes=_UNLIMITED, top_k=1, check_hints=False, **common).best
            points.append(LayoutPoint(cfg, best.tflops_per_gpu, False))
        except InfeasibleError:  # no runnable schedule at this batch at all
            points.append(LayoutPoint(cfg, None, False))
    return tuple(points)
