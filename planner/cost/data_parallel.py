"""Data parallelism and ZeRO as `pplan run` executes them (planner/execute/zero.py): memory shares,
gradient synchronisation, the weights gathered back after the step. Pure.

Per iteration, over the D replicas of one pipeline stage (what planner/execute runs):

  zero  gradient sync (`grad_sync_ms`)                        weights gathered (`zero_weight_gather_ms`)
  0     all-reduce of the gradients after `schedule.step`      none
  1     the same all-reduce (Pipeline.sync_gradients)          ZeroRedundancyOptimizer.step broadcasts each
                                                               updated shard from its owner: every rank
                                                               receives (D-1)/D of the stage's weights
  2     FSDP's reduce-scatter after the stage's last backward  FSDP gathers the whole stage again at the next
        (torch's perform_reduce_grad)                          first forward (reshard_after_forward=False)
  3     the same reduce-scatter                                none here: each layer is gathered before its
                                                               forward and its backward of every micro-batch
                                                               (`zero3_gather_ms`, priced as a collective)

The weight gather is never overlapped (it follows the optimizer step, or precedes the first
forward), so it is priced in the optimizer step's time (planner.cost.tensor_parallel). ZeRO 1+
divides the optimizer step itself by D (each replica steps its share).

Overlap of the sync with backward is an explicit input (`exposed_sync_ms`, `rank_exposed_sync_ms`):
`pplan run` overlaps nothing (it all-reduces after `schedule.step`, planner/execute/train.py, and
torch reduce-scatters after the stage's last backward), so a plan it runs is priced with
overlap=False. overlap=True hides each stage's sync behind that stage's one last backward, as
bucketed DeepSpeed or torch DDP do; Megatron-LM (2021) did not overlap.

Memory (`zero_shares`): stage 1 divides the optimizer state by D; stage 2 too, and FSDP holds the
whole stage's gathered weights beside their shards from the first forward to the reduce-scatter;
stage 3 divides the weights too and gathers each layer's weights before its forward and again
before its backward, the computing layer's gathered weights alive on top (`zero3_gathered_bytes`).
Gradients stay whole at the peak under every stage (a pipeline accumulates them over its
micro-batches). Measured: docs/parallel.md, "How pplan run executes ZeRO".
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from planner.cost.collectives import Link2, allgather_ms, allreduce_ms, reduce_scatter_ms
from planner.cost.memory import MemoryBreakdown
from planner.cost.precision import TrainingPrecision
from planner.errors import PplanError

__all__ = ["zero_shares", "zero_bytes_per_param", "zero3_gathered_bytes", "grad_sync_ms", "zero_weight_gather_ms",
           "exposed_sync_ms", "rank_exposed_sync_ms", "zero3_gather_ms", "replica_memory"]


def zero_shares(dp: int, zero: int) -> tuple[float, float, float]:
    """The shares of the unsharded (weights, gradients, optimizer state) that one GPU holds at a
    pipeline stage's memory peak under ZeRO stage `zero` over `dp` replicas, as `pplan run`
    executes it (measured: docs/parallel.md, "How pplan run executes ZeRO").

    Gradients are never divided: a pipeline accumulates them over its micro-batches (torch's
    stages turn FSDP's gradient sync off until the last backward and reduce-scatter once; sharding
    them earlier would cost M times the traffic), even with one micro-batch. So ZeRO-2 divides
    only the optimizer state, as ZeRO-1, and its weights are 1 + 1/D: FSDP
    (reshard_after_forward=False) keeps the stage's gathered weights beside their shards from the
    first forward to the reduce-scatter. ZeRO-3 divides the weights (the layer computing is
    gathered on top: `zero3_gathered_bytes`). With one replica nothing is sharded."""
    if zero not in (0, 1, 2, 3):
        raise PplanError(f"ZeRO stage must be 0..3, got {zero!r}", "use --zero 0, 1, 2 or 3")
    if dp <= 1 or zero == 0:
        return 1.0, 1.0, 1.0
    shard = 1.0 / float(dp)
    weights = {1: 1.0, 2: 1.0 + shard, 3: shard}[zero]
    return weights, 1.0, shard


def zero_bytes_per_param(dp: int, zero: int, precision: TrainingPrecision) -> float:
    """Static bytes per parameter on one GPU (16 unsharded) under ZeRO stage `zero` over `dp`
    replicas (zero_shares), ZeRO-3's gathered layer not included."""
    w, g, o = zero_shares(dp, zero)
    return precision.weight_bytes * w + precision.grad_bytes * g + precision.optimizer_bytes * o


def zero3_gathered_bytes(param_bytes: Any, dp: int, zero: int) -> np.ndarray:
    """Per layer, the weights ZeRO-3 gathers whole while the layer computes (its forward, its
    backward), in the profile's dtype: alive on top of the GPU's shards at that layer's worst
    moment, so they count as the layer's workspace (planner.cost.workspace_max: one layer at a
    time). Zero for other stages and for one replica."""
    params = np.asarray(param_bytes, dtype=float)
    return params.copy() if zero >= 3 and dp > 1 else np.zeros_like(params)


def grad_sync_ms(grad_bytes: float, dp: int, zero: int, link: Link2) -> float:
    """Per-iteration gradient synchronisation of one stage's `grad_bytes` over `dp` replicas, ms.

    ZeRO 0 and 1: all-reduce (pplan run all-reduces whole gradients under both). ZeRO 2 and 3:
    FSDP's reduce-scatter. The weights gathered back (ZeRO 1/2) are `zero_weight_gather_ms`.
    """
    if dp <= 1:
        return 0.0
    if zero >= 2:
        return float(reduce_scatter_ms(grad_bytes, dp, link))
    return float(allreduce_ms(grad_bytes, dp, link))


def zero_weight_gather_ms(param_bytes: Any, dp: int, zero: int, link: Link2) -> np.ndarray:
    """Per layer, the once-per-iteration gather of this GPU's weights (`param_bytes`, the
    profile's dtype, the one the weights compute in) over `dp` replicas, ms (module docstring):
    ZeRO 1, the optimizer's broadcast of each replica's updated share (every rank receives
    (D-1)/D of the bytes, as in an all-gather); ZeRO 2, FSDP's gather before the first forward.
    Zero for ZeRO 0 and 3 and for one replica. Never overlapped."""
    params = np.asarray(param_bytes, dtype=float)
    if dp <= 1 or zero not in (1, 2):
        return np.zeros_like(params)
    return np.asarray(allgather_ms(params, dp, link), dtype=float)


def exposed_sync_ms(sync_ms: float, last_backward_ms: float, overlap: bool) -> float:
    """The part of the gradient sync on the critical path: with `overlap`, what the stage's last
    backward does not hide; without (as `pplan run` executes it), all of it."""
    return max(0.0, sync_ms - last_backward_ms) if overlap else sync_ms


def rank_exposed_sync_ms(stages: Sequence[Any], overlap: bool, split_backward: bool = False) -> float:
    """The gradient sync of one device's stages (StageCost) left on the critical path: each
    stage's sync overlaps at most that stage's last backward action when `overlap`, else none of
    it. Under a split backward (zero-bubble) that action is a W, which alone makes weight
    gradients: the sync cannot start inside the I before it."""
    return sum(exposed_sync_ms(st.grad_sync_ms, st.bwd_weight_ms if split_backward else st.bwd_ms, overlap)
               for st in stages)


def zero3_gather_ms(param_bytes: Any, dp: int, link: Link2) -> Any:
    """ZeRO-3: all-gather of a layer's weights (`param_bytes`, the profile's dtype) over `dp` ranks, once per forward and once per backward, ms."""
    return allgather_ms(param_bytes, dp, link)


def replica_memory(stages: Sequence[Any], peak_activation_bytes: float, dp: int, zero: int,
                   precision: TrainingPrecision) -> MemoryBreakdown:
    """Peak memory of one GPU holding `stages` (StageCost, parameter bytes in the profile's dtype)
    of a replica: weights, gradients and Adam state per parameter as `precision` says, each
    scaled by the share ZeRO leaves on the GPU at the peak (zero_shares), plus the schedule's
    activations (ZeRO-3's gathered layer is in them, as its workspace) and the boundary buffers.
    The optimizer step holds no activations but its temporaries (the largest layer's measured
    `optimizer_workspace_bytes`, unsharded as the partitioner's DP charges them: ZeRO-1 steps whole
    parameters; ZeRO-2/3 step 1/D shards, so there it is an upper bound, left so because their
    measured peaks varied by up to 4 MB between runs and replicas of one stage, FSDP's buffers
    around its reduce-scatter not being modelled), so those stand for the activations where they
    are larger, as in
    planner.cost.stage_memory (measured, dp 2 x pp 2 of a bf16 GPT whose embedding rank peaks in
    the step: without them rank 0 was predicted 21% under)."""
    n_params = sum(st.param_bytes for st in stages) / precision.element_bytes
    w, g, o = zero_shares(dp, zero)
    step = max((st.optimizer_workspace_bytes for st in stages), default=0.0)
    return MemoryBreakdown(
        weights=n_params * precision.weight_bytes * w,
        gradients=n_params * precision.grad_bytes * g,
        optimizer=n_params * precision.optimizer_bytes * o,
        activations=max(peak_activation_bytes, step),
        buffers=sum(st.buffer_bytes for st in stages),
    )
