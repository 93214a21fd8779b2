"""A data x pipeline x tensor search result as a plan file (the `parallel` object of plan JSON).

The plan holds one pipeline replica: `pp` devices (each standing for a tensor-parallel group
of `tp` GPUs), the chosen cuts, schedule, micro-batches per replica and recompute, with
`parallel` = {dp, pp, tp, zero}; its global batch is dp x micro-batch size x micro-batches.
`predicted` carries what the 3D search simulated (iteration time, tokens/s, TFLOP/s per GPU,
MFU) so `pplan simulate` and reports can show it without the cluster at hand.
"""

from __future__ import annotations

from planner.cost.parallel import Link2, placement
from planner.hardware import Hardware
from planner.partition.parallel_search import ParallelCandidate, ParallelResult
from planner.plan import Device, Links, Plan, Prediction, StagePlan
from planner.profiling.profile import Profile

__all__ = ["parallel_plan"]


def parallel_plan(result: ParallelResult, profile: Profile, hardware: Hardware,
                  candidate: ParallelCandidate | None = None) -> Plan:
    """The plan of `candidate` (default: the best) of `result`, searched on `profile` and `hardware`."""
    c = candidate or result.best
    cfg = c.config
    intra = Link2(hardware.intra_node_bandwidth_bytes_per_s, hardware.intra_node_latency_ms)
    inter = Link2(hardware.inter_node_bandwidth_bytes_per_s, hardware.inter_node_latency_ms)
    place = placement(cfg.dp, cfg.pp, cfg.tp, result.gpus_per_node, intra, inter)
    devices = tuple(Device(name=f"tp-group{i}", memory_bytes=int(hardware.memory_bytes)) for i in range(cfg.pp))
    links = Links(bandwidth_bytes_per_s=inter.bandwidth, latency_ms=inter.latency_ms,
                  pairs=tuple((s, s + 1, link.bandwidth, link.latency_ms) for s, link in enumerate(place.pp)))
    stages = []
    for s in range(len(c.cuts) - 1):
        first, end = c.cuts[s], c.cuts[s + 1]
        recompute = tuple(range(first, end)) if c.recompute == "full" else ()
        stages.append(StagePlan(device=s % cfg.pp, layers=(first, end), recompute=recompute))
    predicted = Prediction(
        iteration_ms=c.iteration_ms, bubble_fraction=c.bubble_fraction, throughput_samples_per_s=c.samples_per_s,
        schedule=c.schedule, n_microbatches=c.n_microbatches, micro_batch_size=c.micro_batch_size,
        tokens_per_s=c.tokens_per_s, tflops_per_gpu=c.tflops_per_gpu, mfu=c.mfu, grad_sync_ms=c.grad_sync_ms,
        tp_comm_ms=c.tp_comm_ms, hardware=hardware.name,
    )
    return Plan(
        schedule=c.schedule, micro_batch_size=c.micro_batch_size, n_microbatches=c.n_microbatches,
        stages=tuple(stages), devices=devices, optimizer="adam", links=links,
        model=profile.meta.get("model"), n_layers=profile.n_layers, profile_path=profile.path,
        profile_sha256=profile.sha256, predicted=predicted, parallel=cfg,
    )
