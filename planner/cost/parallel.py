"""Data- and tensor-parallel cost terms of a (D, P, T) layout: one import for every name. Pure.

N GPUs = D x P x T. These functions turn one pipeline's per-layer costs (planner.cost) into the
costs of one GPU of a (D, P, T) layout, so the exact pipeline DP and the simulator price a
3-D plan with the same formulas as a plain pipeline (planner.partition.parallel_search). Each
concept has its own module; this one re-exports them, so importers need not know which:

  precision        bytes per parameter of the training state, from the profile's dtype
  collectives      links of a layout (placement) and ring all-reduce / all-gather times
  data_parallel    ZeRO's memory shares, gradient sync, weights gathered back, overlap
  tensor_parallel  one GPU's share of each layer under T-way tensor parallelism
  model_flops      model FLOPs per iteration (Narayanan et al. 2021) and the MFU check

What the terms price is what `pplan run` executes (planner/execute/tensor.py, zero.py,
train.py): no sequence parallelism (a block's layer-norm and column-parallel inputs stay whole on
every tp rank), ZeRO-1 as torch's ZeroRedundancyOptimizer (an all-reduce, then a broadcast of the
updated weights), ZeRO-2/3 as FSDP2 under torch's pipeline stages. Whether the gradient sync
overlaps backward is the caller's explicit choice (`pplan run` overlaps none of it). What
Megatron does differently is a flag where it is priced (`vocab_parallel`, overlap).
"""

from __future__ import annotations

from planner.cost.collectives import Link2, Placement, allgather_ms, allreduce_ms, placement, reduce_scatter_ms
from planner.cost.data_parallel import (
    exposed_sync_ms, grad_sync_ms, rank_exposed_sync_ms, replica_memory, zero3_gather_ms, zero3_gathered_bytes,
    zero_bytes_per_param, zero_shares, zero_weight_gather_ms,
)
from planner.cost.model_flops import ModelFlops, checked_mfu, gpt_model_flops, model_flops
from planner.cost.precision import (
    DEFAULT_DTYPE, MIXED_BF16, PURE_FP32, TrainingPrecision, profile_dtype, profile_precision, training_precision,
)
from planner.cost.tensor_parallel import (
    TP_WHOLE_OUTPUTS, collective_ms, tensor_parallel_costs, tp_kept_activation_bytes, tp_layers, tp_shards,
)

__all__ = [
    "TrainingPrecision", "MIXED_BF16", "PURE_FP32", "DEFAULT_DTYPE", "training_precision", "profile_dtype",
    "profile_precision",
    "Link2", "Placement", "placement",
    "allreduce_ms", "allgather_ms", "reduce_scatter_ms",
    "zero_bytes_per_param", "zero_shares", "zero3_gathered_bytes", "grad_sync_ms", "zero_weight_gather_ms",
    "exposed_sync_ms", "rank_exposed_sync_ms", "zero3_gather_ms",
    "collective_ms", "tensor_parallel_costs", "tp_layers", "tp_shards", "tp_kept_activation_bytes", "TP_WHOLE_OUTPUTS",
    "replica_memory",
    "gpt_model_flops", "ModelFlops", "model_flops", "checked_mfu",
]
