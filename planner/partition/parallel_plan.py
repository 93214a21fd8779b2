"""A data x pipeline x tensor search result as a plan file (the `parallel` object of plan JSON).

The plan holds one pipeline replica: `pp` devices (each standing for a tensor-parallel group
of `tp` GPUs), the chosen cuts, schedule, micro-batches per replica and recompute, with
`parallel` = {dp, pp, tp, zero, gpus_per_node, hardware}; its global batch is dp x micro-batch
size x micro-batches. `predicted` carries what the 3D search simulated (iteration time,
tokens/s, TFLOP/s per GPU, MFU); `pplan simulate` prices the plan again on the same hardware
(planner.simulation.replica) and draws its timeline with the collectives on it.
"""

from __future__ import annotations

from dataclasses import replace

from planner.errors import PplanError
from planner.hardware import Hardware
from planner.partition.parallel_search import ParallelCandidate, ParallelResult
from planner.plan import Plan, Prediction, StagePlan
from planner.profiling.profile import Profile
from planner.simulation.replica import Cluster, replica_layout

__all__ = ["parallel_plan"]


def parallel_plan(result: ParallelResult, profile: Profile, hardware: Hardware,
                  candidate: ParallelCandidate | None = None) -> Plan:
    """The plan of `candidate` (default: the best) of `result`, searched on `profile` and `hardware`."""
    if result.vocab_parallel:  # `pplan run` keeps the embedding and head whole: such a plan would not run as priced
        raise PplanError("this search priced Megatron's vocabulary-parallel embedding and head, which pplan run does not execute",
                         "search again with vocab_parallel=False to write a plan")
    c = candidate or result.best
    cfg = replace(c.config, gpus_per_node=result.gpus_per_node, hardware=hardware.name)
    devices, links = replica_layout(cfg, hardware.memory_bytes, Cluster(hardware, result.gpus_per_node))
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
