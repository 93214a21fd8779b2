"""A plan as torch pipeline objects: `build_pipeline(plan, model, rank=..., device_mesh=...)`.

The one function `pplan run` and users' own training loops call:

    from planner import load_plan, build_pipeline
    plan = load_plan("plan.json")
    pipe = build_pipeline(plan, model, rank=dist.get_rank())      # model: nn.Sequential or ModelBundle
    opt = pipe.make_optimizer(lr=1e-3)                              # the plan's optimizer (ZeRO-1: sharded)
    for x, y in batches:                                         # the global batch
        x, y = pipe.local_batch(x), pipe.local_batch(y)          # this replica's slice (dp > 1)
        losses = []
        pipe.schedule.step(x if pipe.is_first else None, target=y if pipe.is_last else None, losses=losses)
        pipe.sync_gradients()                                    # tied weights; dp replicas (zero 0/1)
        opt.step(); opt.zero_grad()

Every rank builds the whole model; after build_pipeline, `release_other_layers(layers,
pipe.parameters())` (planner.models.hf_release; layers: the Sequential, or a ModelBundle's
.layers) frees the weights of the layers other ranks run, inside a Hugging Face model too (its
layers keep the whole transformers model, whose code they run).

It cuts the model as planned (this rank's stages only, recompute layers wrapped in activation
checkpointing), makes one torch `PipelineStage` per stage over the mesh's "pp" process group,
and the torch schedule object for the plan's schedule and micro-batch count (torch's own class
when its order is the planner's, else the planner's action lists through torch's CSV runtime).

Data parallelism (plan.parallel.dp = D > 1): D replicas of the pipeline on a DeviceMesh with
dims ("dp", "pp") (planner.execute.mesh: rank = d * P + p). Replicas are kept in sync by one
bucketed gradient all-reduce over the mesh's "dp" group after `schedule.step` (sync_gradients),
not by wrapping stage modules in DDP: DDP's reducer fires during backward, which under a
pipeline schedule means managing `no_sync` across micro-batches and does not fit zero-bubble's
split I/W backward or tied weights on two ranks; one all-reduce after the step is what the
cost model prices (no overlap), is exact (sum, then divide by D), and is timed on its own.
Measured on dp 2 x pp 2 of the GPT: DDP-wrapped stages fail an internal reducer assert under
gpipe with recompute, leave zb's replicas apart (W's autograd.grad fires no reducer hook) and
differ from the reference by 7e-9 under 1f1b (it pre-divides); torch's FSDP-based `replicate`
is exact on gpipe, 1f1b, zb and interleaved, but turns every parameter into a DTensor (users'
loops and optimizers see them) and cannot own a weight two stages of one rank share.

ZeRO (plan.parallel.zero, with dp > 1; planner.execute.zero): 1 shards the optimizer state
(torch's ZeroRedundancyOptimizer over the dp group, from `pipe.make_optimizer`); 2 and 3 shard
each stage module with FSDP2's fully_shard over the dp sub-mesh, whose gradients torch's stage
code reduce-scatters at the stage's last backward (sync_gradients then only sums tied weights).

Tensor parallelism (plan.parallel.tp = T > 1, the built-in gpt only; planner.execute.tensor):
the mesh has dims ("dp", "pp", "tp") (rank = (d * P + p) * T + t) and each stage's gpt blocks
are parallelized Megatron-style with torch's parallelize_module over the "tp" sub-mesh before
PipelineStage wraps them. Each of the T ranks at a pipeline position runs the same schedule on
the same micro-batches and sends the same replicated tensors to its own tp peer of the next
stage (the "pp" group of its tp index); the data-parallel all-reduce sums each rank's local
shards over its "dp" group. ZeRO-1 steps aliases of the local shards
(planner.execute.tensor.LocalShardsOptimizer).

Stage set-up: each PipelineStage gets the tensors its stage receives and returns for one
micro-batch of `example` (input_args, output_args: planner.execute.stage_io), so torch sets
the stages up statically instead of running each one at the first step on uninitialised
placeholders (its dynamic inference, which token ids crossing a cut do not survive: an
embedding after the cut indexes out of range); without an example, torch's dynamic set-up.

A layout `pplan run` cannot execute (tp > 1 on a model other than the built-in gpt, or not
dividing its heads and FFN width; ZeRO-2/3 over dp > 1 replicas with tp > 1) is refused before
any mesh or stage is built, by planner.partition.parallel_runnable.layout_error: the one rule
`pplan run` (its preflight and build_pipeline) and the 3-D search share, in the same words.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from planner.errors import PplanError
from planner.execute.job_agreement import check_same_plan
from planner.execute.mesh import coords, global_rank, make_mesh, tp_index
from planner.execute import tensor as _tensor
from planner.execute import zero as _zero
from planner.execute.stages import StageModule, build_stage_modules, make_schedule, shared_parameter_groups
from planner.partition.parallel_runnable import layout_error
from planner.plan import Plan, plan_to_dict

__all__ = ["Pipeline", "build_pipeline", "replica_slice"]


def replica_slice(obj: Any, dp_index: int, dp: int) -> Any:
    """Replica `dp_index`'s part of a global batch: the dp_index-th of `dp` equal chunks along
    dim 0 (tensors inside tuples/lists sliced alike). With dp = 1 the batch itself."""
    if dp == 1:
        return obj
    if isinstance(obj, torch.Tensor):
        if obj.shape[0] % dp:
            raise PplanError(f"a global batch of {obj.shape[0]} samples does not split into {dp} equal replica slices",
                             "use a global batch that is a multiple of dp x micro_batch_size x n_microbatches")
        return torch.tensor_split(obj, dp, dim=0)[dp_index]
    if isinstance(obj, (tuple, list)):
        return type(obj)(replica_slice(o, dp_index, dp) for o in obj)
    return obj


@dataclass(frozen=True)
class Pipeline:
    """This rank's part of a planned pipeline: torch stages, the schedule, what it owns."""

    plan: Plan
    """The plan it was built from."""
    stages: tuple[Any, ...]
    """torch PipelineStage objects of this rank (two or more for interleaved schedules)."""
    schedule: Any
    """The torch schedule object: call `schedule.step(...)` once per training step."""
    runtime: str
    """What runs the schedule (a torch class name, or the CSV runtime)."""
    modules: tuple[StageModule, ...]
    """Per stage: global stage index, its layer range, the module PipelineStage wraps, the layers."""
    rank: int
    """Global rank."""
    dp_index: int
    """Which data-parallel replica this rank belongs to (0..dp-1)."""
    pp_index: int
    """Position in the pipeline (0..P-1): runs stages pp_index, pp_index + P, ..."""
    dp: int
    """Data-parallel replicas."""
    device: Any
    """torch.device of the stages."""
    mesh: Any = None
    """The (dp, pp) DeviceMesh, or None for one pipeline on the default group."""
    tied: tuple[tuple[Any, tuple[Any, ...]], ...] = ()
    """(process group, parameters) of weights shared by layers on several pipeline ranks (tied
    embeddings): their gradients are summed over the group."""
    dp_group: Any = None
    """The mesh's "dp" process group of this rank (None when dp = 1)."""
    zero: int = 0
    """The ZeRO stage that runs (the plan's; 0 when dp = 1: one replica has nothing to shard)."""
    reduce_ms: list[float] = field(default_factory=list)
    """ZeRO-2/3: ms of each stage's gradient reduce-scatter in the step so far (sync_gradients reports and clears it)."""
    tp: int = 1
    """Tensor-parallel ranks per pipeline position (the gpt's blocks are sharded over them)."""
    tp_index: int = 0
    """This rank's index among them (0..tp-1)."""

    @property
    def stage_ids(self) -> list[int]:
        """Global stage indices this rank runs."""
        return [m.stage for m in self.modules]

    @property
    def is_first(self) -> bool:
        """Whether this rank feeds the model input (runs stage 0)."""
        return any(st.is_first for st in self.stages)

    @property
    def is_last(self) -> bool:
        """Whether this rank computes the loss (runs the last stage)."""
        return any(st.is_last for st in self.stages)

    def parameters(self) -> list[nn.Parameter]:
        """This rank's parameters, a tied weight once (what its optimizer steps)."""
        return list({id(p): p for m in self.modules for p in m.module.parameters()}.values())

    def make_optimizer(self, lr: float) -> Any:
        """The plan's optimizer over parameters(): ZeroRedundancyOptimizer over the dp group for
        zero = 1 (tp > 1: stepping aliases of the local shards), else the plain one (under zero 2/3
        it steps this rank's shards)."""
        return (_tensor.make_optimizer if self.tp > 1 else _zero.make_optimizer)(self, lr)

    def local_batch(self, obj: Any) -> Any:
        """This replica's slice of a global batch (dim 0 split into dp equal chunks, in replica order)."""
        return replica_slice(obj, self.dp_index, self.dp)

    def sync_gradients(self) -> float:
        """After `schedule.step`: sum tied weights' gradients over their ranks, then average every
        gradient over the data-parallel replicas (one all-reduce per dtype over the "dp" group).
        Returns the data-parallel all-reduce's time in ms (0.0 when dp = 1). Under ZeRO-2/3 the
        step's reduce-scatter already averaged them: returns its time instead."""
        for group, shared in self.tied:
            for p in shared:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                elif not _zero.is_sharded(p.grad) and not p.grad.is_contiguous():
                    # gloo sums tensors storage element by storage element: a transposed gradient
                    # would be added to the wrong elements of the other ranks' copies
                    p.grad = p.grad.contiguous()
                # zero 2/3: both holders shard the weight alike over their replicas, so shards add up
                dist.all_reduce(_zero.local(p.grad), op=dist.ReduceOp.SUM, group=group)
        if self.zero >= 2:
            spent = sum(self.reduce_ms)
            self.reduce_ms.clear()
            return spent
        if self.dp == 1:
            return 0.0
        # tp > 1: each rank all-reduces its own shards with the same shards of the other replicas
        grads = [_zero.local(p.grad) for p in self.parameters() if p.grad is not None]
        # the replicas get here at different times: timed from here, one replica's wait for the other
        # counted as all-reduce (22 ms measured against 1.2 ms predicted; 5-7 ms after a barrier)
        dist.barrier(group=self.dp_group)
        start = time.perf_counter()
        for dtype in sorted({g.dtype for g in grads}, key=str):
            bucket = [g for g in grads if g.dtype == dtype]
            flat = torch.cat([g.reshape(-1) for g in bucket])
            dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.dp_group)
            flat.div_(self.dp)
            offset = 0
            for g in bucket:
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()
            # gloo's worker thread may still hold this tensor for a moment after the all-reduce
            # returns (measured: one replica in two then held the stage's whole gradients once more
            # through the optimizer step, 1,858,048 B); emptying the tensor itself frees its storage
            # whoever holds it, so the step starts without the copy as the cost model assumes
            flat.set_()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return (time.perf_counter() - start) * 1e3


def _layers_of(model: Any) -> nn.Sequential:
    layers = getattr(model, "layers", model)  # a ModelBundle, or the Sequential itself
    if not isinstance(layers, nn.Module):
        raise PplanError(f"build_pipeline needs an nn.Sequential of the plan's layers (or a ModelBundle), got {type(model).__name__}",
                         "pass planner.models.build_model(plan.model, seed=plan.seed) or your own nn.Sequential")
    return layers


def build_pipeline(plan: Plan, model: Any, *, rank: int | None = None, device_mesh: Any = None,
                   device: Any = None, loss_fn: Callable[[Any, Any], Any] | None = None, example: Any = None,
                   prefer_torch: bool = True) -> Pipeline:
    """This rank's stages and the torch schedule of `plan`.

    model        an nn.Sequential whose children are the plan's layers (every rank builds the
                 same weights), or a planner.models ModelBundle (then loss_fn and example
                 default to its own)
    rank         the global rank (default: torch.distributed's, else 0)
    device_mesh  a DeviceMesh with dims ("dp", "pp"), or ("dp", "pp", "tp") when the plan has
                 tp > 1; None: one pipeline on the default group when dp = tp = 1, else the
                 mesh made by planner.execute.mesh.make_mesh
    device       where the stages live (default cpu)
    loss_fn      (output, target) -> loss, given to the schedule
    example      one micro-batch of the model input (plan.micro_batch_size samples along
                 dim 0): shows what crosses each cut (tuples, dicts) and what each stage
                 receives and sends, so torch sets its stages up without running them on
                 placeholders; without it every cut must carry one tensor and torch's first
                 step runs each stage on uninitialised tensors (token ids crossing a cut fail)
    prefer_torch run gpipe/1f1b/interleaved on torch's classes when their order is the plan's

    Needs an initialized process group of dp x P x tp processes.
    """
    from torch.distributed.pipelining import PipelineStage

    device = torch.device(device) if device is not None else torch.device("cpu")
    layers = _layers_of(model)
    loss_fn, example = _model_defaults(plan, model, loss_fn, example)
    if rank is None:
        rank = dist.get_rank() if dist.is_initialized() else 0
    if dist.is_initialized() and dist.get_world_size() > 1:
        # every machine read its own plan file: another one would train another model silently;
        # first, so that every rank reaches this exchange (a check below may refuse one rank only)
        check_same_plan(plan_to_dict(plan), device)
    world = _checked_world(plan)
    zero = _running_zero(plan)
    device_mesh = _checked_mesh(plan, device_mesh, device)
    dp_index, pp_index, pp_group, dp_group = _place(plan, rank, device_mesh)
    mods = build_stage_modules(plan, layers, pp_index, example)
    tied = _place_stage_modules(plan, mods, _tied_groups(plan, layers, rank, world), device, device_mesh, zero)
    stages = tuple(PipelineStage(m.module, m.stage, plan.n_stages, device, group=pp_group, **_static_args(m, device))
                   for m in mods)
    schedule, runtime = make_schedule(plan, list(stages), loss_fn, prefer_torch)
    reduce_ms: list[float] = []
    if zero >= 2:
        _zero.wire_stages(list(stages), zero, reduce_ms, device)
    return Pipeline(plan=plan, stages=stages, schedule=schedule, runtime=runtime, modules=tuple(mods), rank=rank,
                    dp_index=dp_index, pp_index=pp_index, dp=plan.dp, device=device, mesh=device_mesh, tied=tuple(tied),
                    dp_group=dp_group, zero=zero, reduce_ms=reduce_ms, tp=plan.tp, tp_index=tp_index(plan, rank))


def _static_args(m: StageModule, device: Any) -> dict[str, Any]:
    """PipelineStage's input_args and output_args: the tensors the stage receives and returns
    for one micro-batch (stages.build_stage_modules found them from the example), which put
    torch's set-up in its static mode: no set-up forward of a stage on placeholder tensors,
    whose garbage token ids would index an embedding after a cut out of range. Without them
    (no example), torch's dynamic set-up. Released here: the stage keeps only their metadata."""
    example, m.example = m.example, None
    return example.on(device) if example is not None else {}


def _model_defaults(plan: Plan, model: Any, loss_fn: Callable[[Any, Any], Any] | None,
                    example: Any) -> tuple[Callable[[Any, Any], Any], Any]:
    """(loss_fn, example) as given, else a ModelBundle's own loss and first micro-batch input;
    a loss is needed to train."""
    loss_fn = loss_fn if loss_fn is not None else getattr(model, "loss_fn", None)
    if loss_fn is None:
        raise PplanError("build_pipeline needs loss_fn=(output, target) -> loss to train", "pass loss_fn=...")
    if example is None and hasattr(model, "make_batch"):
        example = model.make_batch(plan.micro_batch_size, 0)[0]
    return loss_fn, example


def _checked_world(plan: Plan) -> int:
    """The job's process count, which must be the plan's dp x pipeline devices x tp."""
    world = dist.get_world_size() if dist.is_initialized() else 1
    if world != plan.n_processes:
        raise PplanError(f"the job has {world} processes but the plan needs {plan.n_processes} "
                         f"(dp {plan.dp} x {plan.n_devices} pipeline devices x tp {plan.tp})",
                         f"start {plan.n_processes} processes (torchrun --nproc-per-node)")
    return world


def _running_zero(plan: Plan) -> int:
    """The ZeRO stage that runs (0 when dp = 1: one replica has nothing to shard), after checking
    that a tp plan's model and ZeRO stage can run tensor-parallel."""
    zero = plan.parallel.zero if plan.parallel is not None and plan.dp > 1 else 0
    if plan.parallel is not None:
        error = layout_error(plan.parallel, plan.model)  # the rule the search plans by and preflight refuses by
        if error is not None:
            raise error
    return zero


def _checked_mesh(plan: Plan, device_mesh: Any, device: Any) -> Any:
    """The mesh given, else planner.execute.mesh's for a data/tensor-parallel plan (None for one
    pipeline on the default group); a tp plan's mesh needs a "tp" dim."""
    if device_mesh is None and (plan.dp > 1 or plan.tp > 1):
        device_mesh = make_mesh(plan, device.type)
    if plan.tp > 1 and "tp" not in (device_mesh.mesh_dim_names or ()):
        raise PplanError(f"the plan has tp {plan.tp} but the device mesh has dims {device_mesh.mesh_dim_names}",
                         'make the mesh with planner.execute.mesh.make_mesh (dims "dp", "pp", "tp")')
    return device_mesh


def _place_stage_modules(plan: Plan, mods: list[StageModule], tied: list[tuple[Any, tuple[Any, ...]]], device: Any,
                         device_mesh: Any, zero: int) -> list[tuple[Any, tuple[Any, ...]]]:
    """Move this rank's stage modules to `device`, shard their gpt blocks over the "tp" sub-mesh
    (tp > 1) and the modules over the "dp" sub-mesh (ZeRO-2/3); returns the tied weights' groups
    with the parameters that sharding put in their place."""
    for m in mods:
        m.module.to(device)
    if plan.tp > 1:
        for m in mods:  # every tp rank built the same weights: each keeps its shard
            _tensor.parallelize_blocks(m.layers, device_mesh["tp"])
    if zero >= 2:
        moved = _zero.shard_stages(mods, device_mesh["dp"], zero)
        tied = [(group, tuple(moved.get(id(p), p) for p in shared)) for group, shared in tied]
    return tied


def _place(plan: Plan, rank: int, device_mesh: Any) -> tuple[int, int, Any, Any]:
    """(dp index, pp index, pipeline group, data-parallel group) of `rank`: from the mesh, checked
    against the plan's placement, or the plan's placement on the default group without one."""
    if device_mesh is None:
        dp_index, pp_index = coords(plan, rank)
        return dp_index, pp_index, None, None
    dp_index, pp_index = device_mesh.get_local_rank("dp"), device_mesh.get_local_rank("pp")
    t = device_mesh.get_local_rank("tp") if "tp" in (device_mesh.mesh_dim_names or ()) else 0
    if (dp_index, pp_index, t) != (*coords(plan, rank), tp_index(plan, rank)):
        raise PplanError(f"rank {rank} sits at dp {dp_index}, pp {pp_index}, tp {t} in the mesh but the plan places it at "
                         f"dp {coords(plan, rank)[0]}, pp {coords(plan, rank)[1]}, tp {tp_index(plan, rank)}",
                         "make the mesh with planner.execute.mesh.make_mesh (dims dp, pp[, tp]; rank = (d x P + p) x T + t)")
    return dp_index, pp_index, device_mesh.get_group("pp"), device_mesh.get_group("dp")


def _tied_groups(plan: Plan, layers: Any, rank: int, world: int) -> list[tuple[Any, tuple[Any, ...]]]:
    """(process group, parameters) of each weight `rank` shares with layers on other pipeline ranks
    (tied embeddings): one group per replica and rank set, made by every rank in the same order
    (new_group is collective, so each rank makes the groups it is not in too)."""
    tied = []
    for ranks, shared in shared_parameter_groups(plan, layers):
        for d in range(plan.dp):
            for t in range(plan.tp):
                members = [global_rank(plan, d, r, t) for r in ranks]
                group = dist.new_group(members) if world > 1 else None
                if rank in members:
                    tied.append((group, tuple(shared)))
    return tied
