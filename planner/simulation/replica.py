"""One pipeline replica of a data x pipeline x tensor plan, simulated on a cluster of GPUs.

The replica's P devices each stand for a tensor-parallel group of T GPUs; D replicas run side
by side. Its stages are priced by planner.cost.parallel (compute / T plus the collectives,
the data-parallel gradient sync, ZeRO's sharded memory), the engine times them with the
collectives on the timeline (T rows inside F/B/I, A rows for the gradient sync), and the
result carries the cluster-wide figures: samples/s and tokens/s over all replicas, achieved
TFLOP/s per GPU and MFU (against the hardware's peak in the profile's dtype).

`simulate_replica` is what the 3-D search judges each candidate with
(planner.partition.parallel_eval) and what `simulate(plan, profile)` runs for a plan whose
`parallel` has dp or tp above 1, so `pplan simulate` reproduces the plan's recorded prediction
from the same code.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from planner.cost import StageCost, stage_cost
from planner.cost.parallel import (
    Link2, ModelFlops, Placement, TrainingPrecision, collective_ms, grad_sync_ms, placement, rank_exposed_sync_ms,
    replica_memory, tensor_parallel_costs, tp_layers,
)
from planner.cost.replica_bytes import gradient_bytes, static_bytes
from planner.hardware import MEMORY_BOUND_FRACTION, Hardware
from planner.parallel import ParallelConfig
from planner.plan import Device, Links
from planner.profiling.profile import LayerCosts
from planner.schedules.actions import PipelineSchedule
from planner.simulation.engine import simulate_costs
from planner.simulation.result import ReplicaMetrics, SimResult

__all__ = ["Cluster", "ReplicaCosts", "replica_costs", "replica_layout", "replica_stages", "simulate_replica"]


@dataclass(frozen=True)
class Cluster:
    """The GPUs a replica runs on, and how the costs treat them."""

    hardware: Hardware
    """Peak FLOP/s, memory and links of one GPU."""
    gpus_per_node: int
    """GPUs per node (tensor-parallel groups stay within one)."""
    compute_scale: float = 1.0
    """Multiplies every profiled compute time (a calibration; 1 = as profiled)."""
    overlap_grad_sync: bool = False
    """The gradient sync may overlap each stage's last backward (False, as pplan run does it: it
    all runs after the step)."""

    def placement(self, cfg: ParallelConfig) -> Placement:
        """The links each kind of traffic of `cfg` uses on this cluster."""
        hw = self.hardware
        return placement(cfg.dp, cfg.pp, cfg.tp, self.gpus_per_node,
                         Link2(hw.intra_node_bandwidth_bytes_per_s, hw.intra_node_latency_ms),
                         Link2(hw.inter_node_bandwidth_bytes_per_s, hw.inter_node_latency_ms))

    @property
    def memory_bound_bytes_per_s(self) -> float:
        """What one GPU's memory-bound kernels move per second (the kernels tensor parallelism leaves whole)."""
        return self.hardware.memory_bandwidth_bytes_per_s * MEMORY_BOUND_FRACTION


@dataclass(frozen=True)
class ReplicaCosts:
    """One GPU's per-layer costs under a layout, with the collectives they contain."""

    layers: LayerCosts
    """Compute / T plus collectives, bytes / T (planner.cost.parallel.tensor_parallel_costs)."""
    tp_comm_ms: np.ndarray
    """Per layer: the tensor-parallel all-reduces of one forward (the input-gradient backward repeats them), ms."""
    collectives_ms: np.ndarray
    """Per layer: every collective of one forward (tensor-parallel and ZeRO-3 gathers), ms."""


def replica_costs(raw: LayerCosts, names: tuple[str, ...], cfg: ParallelConfig, cluster: Cluster) -> ReplicaCosts:
    """The costs of one GPU of `cfg` from a profile's one-GPU costs `raw` at some micro-batch size."""
    place = cluster.placement(cfg)
    blocks = tp_layers(names)
    return ReplicaCosts(
        layers=tensor_parallel_costs(raw, blocks, cfg.tp, place.tp, cfg.dp, cfg.zero, place.dp, cluster.compute_scale,
                                     memory_bytes_per_s=cluster.memory_bound_bytes_per_s),
        tp_comm_ms=collective_ms(raw, blocks, cfg.tp, place.tp),
        collectives_ms=collective_ms(raw, blocks, cfg.tp, place.tp, cfg.dp, cfg.zero, place.dp),
    )


def replica_layout(cfg: ParallelConfig, memory_bytes: float, cluster: Cluster) -> tuple[tuple[Device, ...], Links]:
    """The replica's P devices (one tensor-parallel group each) and the links between pipeline neighbours."""
    place = cluster.placement(cfg)
    hw = cluster.hardware
    name = "tp-group" if cfg.tp > 1 else "gpu"  # a label: one GPU is no tensor-parallel group
    devices = tuple(Device(name=f"{name}{i}", memory_bytes=int(memory_bytes)) for i in range(cfg.pp))
    links = Links(bandwidth_bytes_per_s=hw.inter_node_bandwidth_bytes_per_s, latency_ms=hw.inter_node_latency_ms,
                  pairs=tuple((s, s + 1, link.bandwidth, link.latency_ms) for s, link in enumerate(place.pp)))
    return devices, links


def replica_stages(costs: ReplicaCosts, cuts: Sequence[int], recompute: Sequence[Sequence[int]], cfg: ParallelConfig,
                   cluster: Cluster, precision: TrainingPrecision, n_microbatches: int | None = None) -> list[StageCost]:
    """Stage s = layers [cuts[s], cuts[s+1]) with `recompute[s]` recomputed: its collectives,
    its gradient sync over the D replicas and its ZeRO-sharded static bytes, per parameter as
    `precision` says (`n_microbatches`: torch's receive buffers, planner.cost.buffer_bytes)."""
    place = cluster.placement(cfg)
    stages = []
    for s in range(len(cuts) - 1):
        first, end = int(cuts[s]), int(cuts[s + 1])
        st = stage_cost(costs.layers, first, end, recompute[s], "adam", n_microbatches=n_microbatches)
        comm = float(np.sum(costs.collectives_ms[first:end]))
        stages.append(replace(st, comm_fwd_ms=comm, comm_bwd_ms=comm,
                              grad_sync_ms=grad_sync_ms(float(gradient_bytes(st.param_bytes, precision)),
                                                        cfg.dp, cfg.zero, place.dp),
                              static_bytes=float(static_bytes(st.param_bytes, cfg.dp, cfg.zero, precision))))
    return stages


def _tp_comm_per_microbatch_ms(costs: ReplicaCosts, stage: StageCost) -> float:
    """The tensor-parallel all-reduces `stage` is charged for one micro-batch, ms: its forward's,
    the input-gradient backward's (the same again) and the recomputed layers' forward's (their
    collectives are in the recompute time, as their compute is)."""
    tp = costs.tp_comm_ms
    return 2.0 * float(np.sum(tp[stage.first:stage.end])) + float(sum(tp[i] for i in stage.recompute))


def simulate_replica(schedule: PipelineSchedule, costs: ReplicaCosts, cuts: Sequence[int],
                     recompute: Sequence[Sequence[int]], cfg: ParallelConfig, cluster: Cluster, flops: ModelFlops, *,
                     devices: Sequence[Device], links: Links, stage_device: Sequence[int], micro_batch_size: int,
                     record_timeline: bool = False, interpolated: bool = False) -> SimResult:
    """Simulate one iteration of the replica; the result's `replica` holds the cluster-wide figures.
    The model trains in the profile's dtype that `flops` carries: it sets the bytes per parameter
    (planner.cost.parallel.training_precision) and the peak MFU divides by."""
    precision = flops.precision
    stages = replica_stages(costs, cuts, recompute, cfg, cluster, precision, schedule.n_microbatches)
    sim = simulate_costs(schedule, stages, stage_device, devices, links, micro_batch_size=micro_batch_size,
                         record_timeline=record_timeline, interpolated=interpolated,
                         overlap_grad_sync=cluster.overlap_grad_sync,
                         memory_model=functools.partial(replica_memory, dp=cfg.dp, zero=cfg.zero, precision=precision))
    batch = cfg.dp * micro_batch_size * schedule.n_microbatches
    seconds = sim.iteration_ms / 1e3
    full_recompute = all(set(st.recompute) == set(range(st.first, st.end)) for st in stages)
    # figures per device, its stages summed: with v stages per device (interleaved) the engine
    # runs all v syncs after the device's backwards and each micro-batch crosses all v stages
    by_device: dict[int, list[StageCost]] = {}
    for s, st in enumerate(stages):
        by_device.setdefault(int(stage_device[s]), []).append(st)
    metrics = ReplicaMetrics(
        layout=cfg.describe(), gpus=cfg.gpus, hardware=cluster.hardware.name, global_batch=batch,
        tokens_per_s=batch * flops.tokens_per_sample / seconds,
        tflops_per_gpu=flops.achieved(full_recompute) / (seconds * cfg.gpus) / 1e12,
        mfu=flops.plain / (seconds * cfg.gpus * cluster.hardware.peak_flops_per_s(flops.dtype)),
        grad_sync_ms=max(sum(st.grad_sync_ms for st in sts) for sts in by_device.values()),
        grad_sync_exposed_ms=max(rank_exposed_sync_ms(sts, cluster.overlap_grad_sync, schedule.split_backward)
                                 for sts in by_device.values()),
        tp_comm_ms=max(sum(_tp_comm_per_microbatch_ms(costs, st) for st in sts) for sts in by_device.values()),
    )
    return replace(sim, throughput_samples_per_s=batch / seconds, replica=metrics)
