"""The (dp, pp) DeviceMesh of a plan: where each process sits among the replicas and stages.

A plan with `parallel = {dp: D, pp: P}` runs on D x P processes. Rank numbering is torch's
`init_device_mesh` row-major layout over dims ("dp", "pp"): global rank = d * P + p, so the P
ranks of one pipeline replica are consecutive (pipeline neighbours on the nearest links, data
parallelism outermost, as planner/parallel.py places them). A plan without `parallel` (or with
dp = 1) is one pipeline: rank = p, and no mesh is needed.
"""

from __future__ import annotations

from typing import Any

from planner.plan import Plan

__all__ = ["DIMS", "dp_degree", "world_size", "coords", "make_mesh", "global_rank"]

DIMS = ("dp", "pp")
"""The mesh's dimension names, outermost first."""


def dp_degree(plan: Plan) -> int:
    """Data-parallel replicas of the plan (1 without a `parallel` object)."""
    return plan.parallel.dp if plan.parallel is not None else 1


def world_size(plan: Plan) -> int:
    """Processes a run of the plan needs: dp x pipeline devices."""
    return dp_degree(plan) * plan.n_devices


def coords(plan: Plan, rank: int) -> tuple[int, int]:
    """(dp index, pp index) of global rank `rank`."""
    return divmod(rank, plan.n_devices)


def global_rank(plan: Plan, dp_index: int, pp_index: int) -> int:
    """The global rank at (dp index, pp index)."""
    return dp_index * plan.n_devices + pp_index


def make_mesh(plan: Plan, device_type: str) -> Any:
    """torch's DeviceMesh with dims ("dp", "pp") over the initialized default process group."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device_type, (dp_degree(plan), plan.n_devices), mesh_dim_names=DIMS)
