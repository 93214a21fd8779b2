"""The one cost model: (profile costs, a stage, a device, links) -> time and bytes. Pure, no torch.

Every consumer prices a plan through this package: the partitioner's solvers (DP, ILP, brute
force, baselines, recompute refinement) through the per-layer arrays and the formulas
`stage_time_ms` / `stage_bytes`, the simulator through `StageCost`, `action_ms` and `link_ms`
(reports and `pplan run`'s prediction go through the simulator). tests/test_cost_consumers.py
holds each of them to it.

  compute   layer and stage times, the calibration's scale and overheads   (cost.compute)
  memory    weights, gradients, optimizer state, activations with recompute, buffers (cost.memory)
  held      what torch's pipeline runtime holds beyond saved tensors: held output, wgrad, sends (cost.held)
  comm      a transfer over a link, with the calibration's overrides        (cost.comm)
  stage     StageCost of a layer range, and its partitioner figures         (cost.stage)
  arrays    the per-layer arrays a PartitionProblem is built from           (cost.arrays)

Models that are not a chain (LayerCosts with skip edges, planner.graph): a stage [first, end)
receives the crossing bytes of the cut before `first` and sends those of the cut before `end`
(every tensor crossing the cut, hop by hop); kept bytes also hold the pass-through tensors it
only forwards (planner.graph.passthrough_bytes); a recomputed layer keeps everything it reads
from earlier layers (LayerCosts.layer_input_bytes). Without skip edges these are the chain's
numbers.

Data and tensor parallelism (planner.cost.parallel re-exports them): precision (bytes per
parameter), collectives (placement, ring all-reduce / all-gather), data_parallel (ZeRO shares,
gradient sync and its overlap), tensor_parallel (one GPU's share of each layer) and model_flops
(FLOPs per iteration, MFU); they turn per-layer costs into one GPU's, which the same pipeline
formulas above then price.
"""

from planner.cost.arrays import LayerArrays, layer_arrays
from planner.cost.comm import Link, link_between, link_ms, link_terms, transfer_ms
from planner.cost.compute import (
    action_ms, actions_per_microbatch, compute_terms, layer_compute_ms, microbatch_overhead_ms, scaled_ms,
    stage_time_ms,
)
from planner.cost.memory import (
    OPTIMIZER_STATE_FACTOR, MemoryBreakdown, boundary_bytes, checkpoint_input_bytes, kept_bytes, optimizer_factor,
    recompute_saving, scaled_skip_edges, stage_bytes, stage_memory, static_bytes_per_layer,
    moment_bytes, fixed_bytes,
    transient_bytes, workspace_max, optimizer_workspace, buffer_bytes,
    receive_buffer_microbatches,
    kept_activation_bytes, runtime_buffers, stage_entry_bytes,
)
from planner.cost.held import held_output, held_output_per_layer
from planner.cost.batch import layer_range_batch_bytes, stage_batch_bytes
from planner.cost.stage import StageCost, microbatch_ms, stage_cost, stage_peak_bytes

__all__ = [
    "OPTIMIZER_STATE_FACTOR",
    "LayerArrays",
    "Link",
    "MemoryBreakdown",
    "StageCost",
    "action_ms",
    "actions_per_microbatch",
    "boundary_bytes",
    "buffer_bytes",
    "stage_batch_bytes",
    "layer_range_batch_bytes",
    "receive_buffer_microbatches",
    "checkpoint_input_bytes",
    "compute_terms",
    "kept_activation_bytes",
    "kept_bytes",
    "layer_arrays",
    "layer_compute_ms",
    "link_between",
    "link_ms",
    "link_terms",
    "microbatch_ms",
    "microbatch_overhead_ms",
    "optimizer_factor",
    "recompute_saving",
    "runtime_buffers",
    "scaled_ms",
    "scaled_skip_edges",
    "stage_bytes",
    "moment_bytes",
    "fixed_bytes",
    "stage_cost",
    "stage_entry_bytes",
    "stage_memory",
    "stage_peak_bytes",
    "stage_time_ms",
    "static_bytes_per_layer",
    "transfer_ms",
    "transient_bytes",
    "workspace_max",
    "optimizer_workspace",
    "held_output",
    "held_output_per_layer",
]
