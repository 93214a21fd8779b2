"""One replica of a tiny gpt on the cpu preset, simulated as `pplan simulate` prices a data/tensor-
parallel plan: two pipeline ranks on one node of 4, 1f1b, 4 micro-batches of 2 per replica."""

from __future__ import annotations

from typing import Any, Sequence

from planner.cost.parallel import model_flops
from planner.hardware import load_hardware
from planner.parallel import ParallelConfig
from planner.profiling.analytic import analytic_profile
from planner.schedules import generate
from planner.simulation.replica import Cluster, replica_costs, replica_layout, simulate_replica


def two_stage_cpu_replica(spec: str, cuts: Sequence[int], *, tp: int = 1, dp: int = 1, zero: int = 0) -> Any:
    """The SimResult of gpt `spec` cut at `cuts` (two stages) under dp x 2 x tp and ZeRO `zero`."""
    hw = load_hardware("cpu")
    prof = analytic_profile(spec, hw, "float32", [2])
    cfg = ParallelConfig(dp=dp, pp=2, tp=tp, zero=zero, gpus_per_node=4, hardware="cpu")
    cluster = Cluster(hw, 4)
    devices, links = replica_layout(cfg, hw.memory_bytes, cluster)
    return simulate_replica(generate("1f1b", 2, 4), replica_costs(prof.at(2), prof.names, cfg, cluster), list(cuts),
                            [(), ()], cfg, cluster, model_flops(prof, 8 * dp), devices=devices, links=links,
                            stage_device=[0, 1], micro_batch_size=2)
