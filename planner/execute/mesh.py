"""The (dp, pp[, tp]) DeviceMesh of a plan: where each process sits among replicas, stages and tensor shards.

A plan with `parallel = {dp: D, pp: P, tp: T}` runs on D x P x T processes. Rank numbering is
torch's `init_device_mesh` row-major layout: with T = 1 over dims ("dp", "pp"), global rank =
d * P + p, so the P ranks of one pipeline replica are consecutive (pipeline neighbours on the
nearest links, data parallelism outermost, as planner/parallel.py places them); with T > 1 over
dims ("dp", "pp", "tp"), global rank = (d * P + p) * T + t: the T ranks of one tensor-parallel
group are consecutive (Megatron places them inside a node, on its fastest links), pipeline
neighbours next, data parallelism outermost. A plan without `parallel` (or with dp = tp = 1) is
one pipeline: rank = p, and no mesh is needed.
"""

from __future__ import annotations

from typing import Any

from planner.plan import Plan

__all__ = ["DIMS", "TP_DIMS", "world_text", "coords", "tp_index", "make_mesh", "global_rank"]

DIMS = ("dp", "pp")
"""The mesh's dimension names, outermost first (tp = 1)."""
TP_DIMS = ("dp", "pp", "tp")
"""The mesh's dimension names with tensor parallelism (tp > 1), outermost first."""


def world_text(plan: Plan) -> str:
    """How the plan's processes multiply up, for messages: `2 devices x dp 2 x tp 2`."""
    text = f"{plan.n_devices} devices x dp {plan.dp}"
    return text + (f" x tp {plan.tp}" if plan.tp > 1 else "")


def coords(plan: Plan, rank: int) -> tuple[int, int]:
    """(dp index, pp index) of global rank `rank`."""
    return divmod(rank // plan.tp, plan.n_devices)


def tp_index(plan: Plan, rank: int) -> int:
    """Tensor-parallel index of global rank `rank` (0 when tp = 1)."""
    return rank % plan.tp


def global_rank(plan: Plan, dp_index: int, pp_index: int, tp_index: int = 0) -> int:
    """The global rank at (dp index, pp index, tp index)."""
    return (dp_index * plan.n_devices + pp_index) * plan.tp + tp_index


def make_mesh(plan: Plan, device_type: str) -> Any:
    """torch's DeviceMesh over the initialized default process group: dims ("dp", "pp"), or
    ("dp", "pp", "tp") when the plan has tensor parallelism."""
    from torch.distributed.device_mesh import init_device_mesh

    if plan.tp > 1:
        return init_device_mesh(device_type, (plan.dp, plan.n_devices, plan.tp), mesh_dim_names=TP_DIMS)
    return init_device_mesh(device_type, (plan.dp, plan.n_devices), mesh_dim_names=DIMS)
