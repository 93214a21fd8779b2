"""ZeRO stages 1-3 of a data-parallel pipeline, with torch's own machinery (used by build_pipeline).

Each ZeRO stage shards over the mesh's "dp" dimension, i.e. among the D replicas of one pipeline
position; a plan with dp = 1 has nothing to shard and runs as zero = 0.

- zero = 1: torch.distributed.optim.ZeroRedundancyOptimizer over the dp group (make_optimizer):
  each replica keeps the optimizer state of its share of the stage's parameters, steps only
  those, and broadcasts them; gradients are still all-reduced whole (Pipeline.sync_gradients).
- zero = 2 / 3: FSDP2 `fully_shard` of each stage module over the dp sub-mesh (shard_stages):
  parameters at rest, gradients after the step's reduce-scatter and the optimizer state are
  1/D per rank. torch.distributed.pipelining drives it: micro-batch backwards accumulate
  unsharded gradients without communication (set_requires_gradient_sync(False)) and the
  stage's last backward (perform_reduce_grad) reduce-scatters them once, averaged over D, so
  sync_gradients must not all-reduce them again. zero = 2 keeps a stage's weights gathered from
  its first forward to that reduce-scatter (reshard_after_forward=False); zero = 3 makes each
  layer its own unit that is gathered for its forward and again for its backward of every
  micro-batch, and let go after each (reshard_after_forward=True, and after backward: wire_stages).

What torch's pipelining gives differs from the cost model's ZeRO-2/3 in one place: the
gradients accumulated over micro-batches are unsharded until the reduce-scatter, so a step's
gradient peak is the full stage's, not 1/D (per-micro-batch reduce-scatters would shard them at
M times the communication; torch's stage code turns gradient sync off between micro-batches).

Checkpoints hold full tensors (full_state / full_optimizer_state gather them over the dp group),
the same layout as zero = 0: a save can be resumed with another ZeRO stage or replica count.
"""

from __future__ import annotations

import inspect
import time
import weakref
from collections import Counter
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from planner.errors import PplanError
from planner.execute.measure import MemoryTracker
from planner.master_weights import MASTER_KEY, is_16bit

__all__ = ["shard_stages", "wire_stages", "make_optimizer", "local", "load_full_state",
           "full_state", "full_optimizer_state", "load_optimizer_state", "optimizer_state_bytes", "is_sharded",
           "held_bytes", "GatheredWeightsTracker"]


def is_sharded(t: Any) -> bool:
    """Whether `t` is a DTensor (a fully_shard parameter, its gradient or optimizer state)."""
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of `t` (its shard of a DTensor, else `t`)."""
    return t.to_local() if is_sharded(t) else t


def shard_stages(mods: list[Any], dp_mesh: Any, zero: int) -> dict[int, nn.Parameter]:
    """fully_shard this rank's stage modules over `dp_mesh` (zero 2 or 3), before torch's
    PipelineStage wraps them. Parameter-free stages stay as they are (nothing to shard).

    zero = 3: each layer whose parameters no other layer of the stage uses is its own unit
    (gathered around its own forward and backward); a weight two layers share stays with the
    stage's root unit. A weight two stages of one rank share (interleaved, tied ends) is refused:
    two FSDP roots cannot own one parameter.

    16-bit parameters (a bfloat16 plan) become fp32 shards, the master weights, and FSDP's
    MixedPrecisionPolicy gathers them in the 16-bit dtype for compute and reduce-scatters the
    gradients in it (param_dtype = reduce_dtype = that dtype: 2 B gathered weights and 2 B whole
    gradients, the 12 B of fp32 masters and Adam state divided by D, as the cost model prices
    ZeRO-2/3; the optimizer then steps fp32 shards, without a master copy of its own).

    Returns id(parameter before) -> the DTensor parameter that replaced it (fully_shard swaps
    each module's parameters, so lists made before, such as Pipeline.tied, must be remapped)."""
    from torch.distributed.fsdp import fully_shard

    owner: dict[int, int] = {}
    for m in mods:
        for p in m.module.parameters():
            if owner.setdefault(id(p), m.stage) != m.stage:
                raise PplanError(f"ZeRO stage {zero} cannot shard a weight that stages {owner[id(p)]} and {m.stage} of one "
                                 "rank share (fully_shard gives each stage its own root)",
                                 'use "zero": 1 (or 0) for this plan, or cut it so the tied layers sit on different ranks')
    before = {(m.stage, name): p for m in mods for name, p in m.module.named_parameters(remove_duplicate=False)}
    policy = _fp32_master_policy([m.module for m in mods])
    for m in mods:
        if not any(True for _ in m.module.parameters()):
            continue
        if zero == 3:
            uses = Counter(id(p) for layer in m.module.layers for p in layer.parameters())
            for layer in m.module.layers:
                ps = list(layer.parameters())
                if ps and all(uses[id(p)] == 1 for p in ps):
                    fully_shard(layer, mesh=dp_mesh, reshard_after_forward=True, **policy)
        fully_shard(m.module, mesh=dp_mesh, reshard_after_forward=zero == 3, **policy)
        if policy:
            _GATHERED_DTYPE[m.module] = policy["mp_policy"].param_dtype
    after = {(m.stage, name): p for m in mods for name, p in m.module.named_parameters(remove_duplicate=False)}
    return {id(p): after[key] for key, p in before.items()}


_GATHERED_DTYPE: "weakref.WeakKeyDictionary[nn.Module, torch.dtype]" = weakref.WeakKeyDictionary()
"""Stage module -> the 16-bit dtype FSDP gathers its fp32 master shards in (held_bytes counts
gathered weights and whole gradients in it); absent for a float32 stage."""


def _fp32_master_policy(modules: list[nn.Module]) -> dict[str, Any]:
    """fully_shard's mp_policy argument for modules with 16-bit parameters (each made fp32 here,
    in place: the masters FSDP shards), else {} (float32: FSDP's default, no casts)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    params = list({id(p): p for mod in modules for p in mod.parameters()}.values())
    compute = next((p.dtype for p in params if is_16bit(p)), None)
    if compute is None:
        return {}
    with torch.no_grad():
        for p in params:
            if is_16bit(p):
                p.data = p.data.to(torch.float32)  # the same Parameter object (tied lists stay valid)
    return {"mp_policy": MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=compute)}


def wire_stages(stages: list[Any], zero: int, reduce_ms: list[float], device: torch.device) -> None:
    """Adapt torch's PipelineStage objects of fully_shard modules (zero 2/3):

    - time each stage's end-of-step gradient reduction (perform_reduce_grad: FSDP's
      reduce-scatter, then the division by M) into `reduce_ms`;
    - zero = 3: let every unit reshard right after its own backward of each micro-batch. torch's
      stage code turns resharding after backward off until the last backward, which would keep
      the whole stage gathered between micro-batches (ZeRO-2's weights, ZeRO-3's traffic);
    - gather the weights before the I and W steps of zero-bubble's split backward. torch's
      input-gradient step finds the weights' gradient nodes through `submod.parameters()` before
      autograd runs FSDP's pre-backward hook; when a forward resharded them that gives the sharded
      DTensors, no weight is found in the graph and the W steps compute nothing (measured: every
      gradient of a non-first zb stage stayed None). Gathered first, parameters() names the
      weights the forward used (a no-op when they are still gathered).
    """
    from torch.distributed.fsdp import FSDPModule

    for st in stages:
        units = [m for m in st.submod.modules() if isinstance(m, FSDPModule)]
        if not units:
            continue

        def reduce(factor: int, run: Any = st.perform_reduce_grad) -> None:
            start = time.perf_counter()
            run(factor)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            reduce_ms.append((time.perf_counter() - start) * 1e3)

        def backward(kind: str, kwargs: dict, last_backward: bool = False, run: Any = st.backward_maybe_with_nosync,
                     units: list = units) -> Any:
            if kind in ("input", "weight"):
                for unit in units:
                    unit.unshard()
            return run(kind, kwargs, last_backward)

        st.perform_reduce_grad = reduce
        st.backward_maybe_with_nosync = backward
        if zero == 3:
            def reshard_after_backward(value: bool, *, recurse: bool = True, _set: Any = st.submod.set_reshard_after_backward) -> None:
                _set(True, recurse=recurse)

            st.submod.set_reshard_after_backward = reshard_after_backward


def make_optimizer(pipe: Any, lr: float, wrap: Any = None) -> Any:
    """The plan's optimizer over the pipeline's parameters: ZeroRedundancyOptimizer over the dp
    group for zero = 1 (same class and settings, state sharded by parameter; `wrap(params,
    make)` builds it instead when given: tensor parallelism's LocalShardsOptimizer); the plain
    one otherwise (zero = 2/3 parameters are DTensors: it steps this rank's shards)."""
    from planner.execute.stages import make_optimizer as plain

    params = pipe.parameters()
    if pipe.zero != 1 or not params:
        return plain(pipe.plan.optimizer, params, lr)
    from torch.distributed.optim import ZeroRedundancyOptimizer

    # the class and settings the plan names, for parameters of this dtype: over 16-bit ones the
    # fp32-master class (planner.master_weights), so each replica keeps the masters of its share
    # only, sharded with the moments (the 12 B per parameter the cost model divides by D)
    probe = plain(pipe.plan.optimizer, [nn.Parameter(torch.zeros(1, dtype=params[0].dtype))], lr)
    accepted = inspect.signature(type(probe)).parameters
    kwargs = {k: v for k, v in probe.defaults.items() if k in accepted}

    def make(ps: list[nn.Parameter]) -> Any:
        return ZeroRedundancyOptimizer(ps, optimizer_class=type(probe), process_group=pipe.dp_group, **kwargs)

    return wrap(params, make) if wrap is not None else make(params)


def optimizer_state_bytes(opt: Any) -> int:
    """Bytes of optimizer state this rank holds (its shard under ZeRO)."""
    state = opt.optim.state if hasattr(opt, "consolidate_state_dict") else opt.state
    return sum(local(v).numel() * v.element_size() for st in state.values() for v in st.values()
               if isinstance(v, torch.Tensor))


def load_full_state(module: nn.Module, state: dict[str, Any]) -> None:
    """module.load_state_dict of full tensors (a checkpoint), each entry that is a DTensor in the
    module becoming this rank's shard of the saved tensor (every replica loads the same file)."""
    from torch.distributed.tensor import distribute_tensor

    own = module.state_dict()
    module.load_state_dict({k: distribute_tensor(v.to(own[k].device), own[k].device_mesh, own[k].placements, src_data_rank=None)
                            if k in own and is_sharded(own[k]) and not is_sharded(v) else v for k, v in state.items()})


def full_state(state: dict[str, Any]) -> dict[str, Any]:
    """A state dict with every DTensor gathered whole (collective over the dp group: every
    replica at this pipeline position calls it for the same layers in the same order)."""
    return {k: v.full_tensor() if is_sharded(v) else v for k, v in state.items()}


def full_optimizer_state(opt: Any, pipe: Any) -> dict[str, Any]:
    """The whole optimizer state of this rank's stages, on every replica, in the layout a plain
    optimizer's state_dict has (parameter indices, full tensors). Collective over the dp group."""
    from torch.utils._pytree import tree_map

    if hasattr(opt, "consolidate_state_dict"):  # ZeroRedundancyOptimizer
        opt.consolidate_state_dict(to=0)
        box = [opt.state_dict() if pipe.dp_index == 0 else None]
        dist.broadcast_object_list(box, group=pipe.dp_group, group_src=0)
        return box[0]
    return tree_map(lambda v: v.full_tensor() if is_sharded(v) else v, opt.state_dict())


def load_optimizer_state(opt: Any, state: dict[str, Any]) -> None:
    """Load a full optimizer state (a save of any ZeRO stage or of zero = 0) into `opt`: a
    ZeroRedundancyOptimizer keeps its own parameters' part; over DTensor parameters each state
    tensor of a parameter's shape becomes this rank's shard of it."""
    opt.load_state_dict(state)
    if hasattr(opt, "consolidate_state_dict"):
        # ZeroRedundancyOptimizer's own Optimizer.load_state_dict kept copies of this replica's state
        # cast to the 16-bit parameters' dtype (masters, moments), which nothing reads: its local
        # optimizer holds the state it steps. (tp: LocalShardsOptimizer wraps it as `inner`.)
        getattr(opt, "inner", opt).state.clear()
        return
    from torch.distributed.tensor import distribute_tensor

    for p, st in opt.state.items():
        if not is_sharded(p):
            continue
        for k, v in st.items():
            if isinstance(v, torch.Tensor) and not is_sharded(v) and tuple(v.shape) == tuple(p.shape):
                # every replica holds the same full tensor: each keeps its own shard, no communication
                st[k] = distribute_tensor(v.to(p.device), p.device_mesh, p.placements, src_data_rank=None)
    _adopt_saved_masters(opt)


def _adopt_saved_masters(opt: Any) -> None:
    """A save of a 16-bit run at ZeRO 0/1 holds each weight's fp32 master in its optimizer state;
    an optimizer over fp32 parameters (ZeRO-2/3's master shards) takes it as the weight itself
    instead of keeping it as state (the saved 16-bit weights are its rounding)."""
    state = getattr(opt, "state", None)
    if not isinstance(state, dict):
        return
    with torch.no_grad():
        for p, st in state.items():
            if isinstance(st, dict) and isinstance(p, torch.Tensor) and not is_16bit(p) and MASTER_KEY in st:
                p.copy_(st.pop(MASTER_KEY))


def held_bytes(pipe: Any, opt: Any, grad_bytes: int) -> dict[str, int]:
    """Weights, gradients and optimizer state this rank holds at its peak in a step (bytes).

    `grad_bytes`: the gradients after sync_gradients (zero 0/1: whole; zero 2/3: this rank's
    shard after the reduce-scatter). Under zero 2/3 the micro-batches accumulate unsharded
    gradients of the whole stage until that reduce-scatter, which is the peak counted here;
    weights are this rank's shards plus what is gathered at once: the whole stage (zero 2,
    gathered from the first forward to the reduce-scatter) or the largest unit (zero 3). A
    16-bit plan's shards are its fp32 masters, counted with the optimizer state (as the cost
    model counts masters), and its gathered weights and whole gradients are 16-bit."""
    params = pipe.parameters()
    shards = sum(local(p).numel() * p.element_size() for p in params)
    state = optimizer_state_bytes(opt)
    if pipe.zero < 2:  # tensor parallelism: this rank's shards of the tp blocks (shards == full without tp)
        return {"weights": shards, "gradients": grad_bytes or shards, "optimizer": state}
    from torch.distributed.fsdp import FSDPModule

    size = {id(p): p.numel() * (_GATHERED_DTYPE[m.module].itemsize if m.module in _GATHERED_DTYPE else p.element_size())
            for m in pipe.modules for p in m.module.parameters()}
    full = sum(size[id(p)] for p in params)

    def own_bytes(unit: nn.Module) -> int:  # what gathering `unit` gathers: its parameters outside units inside it
        inner = {id(p) for c in unit.modules() if c is not unit and isinstance(c, FSDPModule) for p in c.parameters()}
        return sum(size[id(p)] for p in unit.parameters() if id(p) not in inner)

    largest = max((own_bytes(u) for m in pipe.modules for u in m.module.modules() if isinstance(u, FSDPModule)), default=0)
    gathered = full if pipe.zero == 2 else largest
    if any(m.module in _GATHERED_DTYPE for m in pipe.modules):
        return {"weights": gathered, "gradients": full, "optimizer": state + shards}
    return {"weights": shards + gathered, "gradients": full, "optimizer": state}


class GatheredWeightsTracker(MemoryTracker):
    """MemoryTracker that does not count a gathered weight (fully_shard's unsharded parameter,
    saved for backward) as an activation: its storage is FSDP's, freed when the unit reshards
    and gathered again for backward. Gathered storages change with every gather, so they are
    looked up at each save (a unit's registered parameters are its gathered ones while it runs)."""

    def __init__(self, modules: list[nn.Module], **kwargs: Any):
        super().__init__(**kwargs)
        self._modules = modules

    def pack(self, t: torch.Tensor) -> Any:
        from planner.profiling.saved import storage_key

        key = storage_key(t)[0]
        if any(storage_key(p)[0] == key for m in self._modules for p in m.parameters() if not is_sharded(p)):
            return t
        return super().pack(t)
