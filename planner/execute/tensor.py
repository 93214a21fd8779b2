"""Megatron-style tensor parallelism of the built-in gpt's blocks over the mesh's "tp" dimension.

`parallelize_blocks(layers, tp_mesh)` applies torch's `parallelize_module` to every
planner.models.gpt.Block among `layers` (Shoeybi et al. 2019, as torchtitan does for Llama):

- column-parallel (`ColwiseParallel`): the attention's QKV projection and the MLP's first
  linear. Each tp rank computes its share of the heads and of the FFN width from the
  replicated block input; the backward all-reduces the input's gradient over tp (Megatron's f).
- row-parallel (`RowwiseParallel`): the attention's output projection and the MLP's second
  linear, whose partial sums are all-reduced over tp in forward (Megatron's g), so each block
  returns a plain replicated tensor: what crosses a pipeline cut is what it was without tp.
- replicated on every tp rank: layer norms, the row-parallel biases (DTensors, Replicate),
  the embedding, the final norm and the LM head. Their inputs and output gradients are
  replicated, so every tp rank computes the same gradients for them: no all-reduce over tp.

Two adaptations, both in this module, the model's own code untouched:

- The QKV weight's rows are (q | k | v) x heads x head_dim. Column-parallel sharding cuts rows
  into T consecutive blocks, which for T = 2 would give rank 0 all of q and half of k. Before
  sharding, its rows (and bias) are reordered to tp rank x (q | k | v) x local heads x
  head_dim (`qkv_order`), so each rank's block holds q, k and v of its own heads; full tensors
  (checkpoints, comparisons) are put back in the model's order (`full_layer_state`).
- The block's forward reshapes QKV by its head count and the full hidden size; a tp block runs
  `_tp_block_forward`, the same computation over its local heads (torchtitan likewise sets the
  attention module's head count to the local one).

Around it: checkpoints hold full tensors in the model's layout (full_layer_state,
full_optimizer_state; loaded back with load_layer_state, load_optimizer_state), so a save
resumes with any tp; ZeRO-1 steps plain aliases of the local shards (LocalShardsOptimizer);
the memory tracker counts saved DTensors by their local shards (ShardTracker). Which layouts get
here at all (the built-in gpt, tp dividing its heads and FFN width; no ZeRO-2/3 over dp > 1 with
tp > 1) is planner.partition.parallel_runnable.layout_error, the one rule `pplan run` (preflight
and build_pipeline) and the 3-D search share; `parallelize_blocks` asks its heads-and-width part
(tp_shape_error) again of every block it splits.
"""

from __future__ import annotations

import types
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from planner.execute import zero
from planner.execute.measure import MemoryTracker
from planner.partition.parallel_runnable import tp_shape_error

__all__ = ["qkv_order", "parallelize_blocks", "full_layer_state",
           "load_layer_state", "unpermute_optimizer_state", "permute_optimizer_state", "LocalShardsOptimizer", "make_optimizer",
           "full_optimizer_state", "load_optimizer_state", "ShardTracker"]


def qkv_order(hidden: int, heads: int, tp: int) -> torch.Tensor:
    """Row indices of the model's QKV weight in tp order: row i of the tp layout is row
    order[i] of the model's (q | k | v) x heads x head_dim layout."""
    d, local = hidden // heads, heads // tp
    idx = torch.arange(3 * hidden).view(3, tp, local, d)  # (q|k|v), tp rank, local head, head dim
    return idx.permute(1, 0, 2, 3).reshape(-1)


def _tp_block_forward(self: Any, x: torch.Tensor) -> torch.Tensor:
    """planner.models.gpt.Block.forward over this tp rank's heads (self.tp_heads of them):
    the QKV output is this rank's (q | k | v) x local heads x head_dim, the attention output its
    heads' columns, which the row-parallel projection sums over tp ranks."""
    b, t, c = x.shape
    d = c // self.heads
    q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.tp_heads, d).permute(2, 0, 3, 1, 4).unbind(0)
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    x = x + self.proj(a.transpose(1, 2).reshape(b, t, self.tp_heads * d))
    return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def _blocks(layers: list[nn.Module]) -> list[nn.Module]:
    from planner.models.gpt import Block

    return [m for layer in layers for m in layer.modules() if type(m) is Block]


def parallelize_blocks(layers: list[nn.Module], tp_mesh: Any) -> int:
    """Tensor-parallelize every gpt Block among `layers` (in place) over the 1-D `tp_mesh`;
    returns how many. Every tp rank must hold the same weights before (built from one seed):
    parallelize_module keeps each rank's shard of them without communication."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    tp = tp_mesh.size()
    blocks = _blocks(layers)
    for blk in blocks:
        hidden = blk.ln1.normalized_shape[0]
        error = tp_shape_error(blk.heads, blk.fc1.out_features, tp)  # the rule the search and preflight apply
        if error is not None:
            raise error
        order = qkv_order(hidden, blk.heads, tp)
        with torch.no_grad():
            blk.qkv.weight.copy_(blk.qkv.weight[order])
            blk.qkv.bias.copy_(blk.qkv.bias[order])
        parallelize_module(blk, tp_mesh, {"qkv": ColwiseParallel(), "fc1": ColwiseParallel(),
                                          "proj": RowwiseParallel(), "fc2": RowwiseParallel()})
        blk.tp_heads = blk.heads // tp
        blk.tp_order = {"qkv.weight": order, "qkv.bias": order}
        blk.forward = types.MethodType(_tp_block_forward, blk)
    return len(blocks)


def _orders(layer: nn.Module) -> dict[str, torch.Tensor]:
    """state-dict key -> row order of the tp layout, for every reordered tensor under `layer`."""
    out = {}
    for prefix, m in layer.named_modules():
        for key, order in getattr(m, "tp_order", {}).items():
            out[f"{prefix}.{key}" if prefix else key] = order
    return out


def full_layer_state(layer: nn.Module) -> dict[str, Any]:
    """The layer's state dict as full tensors in the model's own layout (DTensors gathered over
    their mesh, QKV rows put back in model order): collective over the layer's tp group (and
    its dp group under ZeRO-2/3)."""
    from planner.execute.zero import full_state

    orders = _orders(layer)
    out = full_state(layer.state_dict())
    for k, order in orders.items():
        full = torch.empty_like(out[k])
        full[order] = out[k]
        out[k] = full
    return out


def load_layer_state(layer: nn.Module, state: dict[str, Any]) -> None:
    """Load full tensors in model layout (a checkpoint) into `layer`: reordered rows for tp
    blocks, and each DTensor entry becomes this rank's shard of the saved tensor."""
    from planner.execute.zero import load_full_state

    orders = _orders(layer)
    load_full_state(layer, {k: v[orders[k]] if k in orders else v for k, v in state.items()})


def _local_view(t: Any) -> Any:
    """A DTensor's local shard (the same storage; no autograd node, unlike zero.local), any other value itself."""
    if zero.is_sharded(t):
        with torch.no_grad():
            return t.to_local()
    return t


class LocalShardsOptimizer:
    """ZeRO-1 under tensor parallelism. torch's ZeroRedundancyOptimizer broadcasts each
    parameter with c10d.broadcast, which a DTensor refuses (NotImplementedError: "Operator
    c10d.broadcast_.default does not have a sharding strategy registered", torch 2.13), so it
    steps plain Parameters that alias each DTensor parameter's local shard: the same storage,
    so its in-place step and broadcast update the DTensor. Before each step the aliases get the
    DTensors' local gradients. Its state is therefore per local shard (full_optimizer_state
    gathers it over tp)."""

    def __init__(self, params: list[nn.Parameter], make: Any):
        self.params = params
        self.aliases = [nn.Parameter(_local_view(p), requires_grad=p.requires_grad) if zero.is_sharded(p) else p
                        for p in params]
        self.inner = make(self.aliases)

    @property
    def optim(self) -> Any:
        """The wrapped ZeroRedundancyOptimizer's local optimizer (this rank's partition)."""
        return self.inner.optim

    def step(self, closure: Any = None) -> Any:
        for p, a in zip(self.params, self.aliases):
            if a is not p:
                a.grad = None if p.grad is None else _local_view(p.grad)
        return self.inner.step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.inner.zero_grad(set_to_none)
        for p, a in zip(self.params, self.aliases):
            if a is not p and set_to_none:
                p.grad = None

    def consolidate_state_dict(self, to: int = 0) -> None:
        self.inner.consolidate_state_dict(to)

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state)


def make_optimizer(pipe: Any, lr: float) -> Any:
    """The plan's optimizer of a tp pipeline: planner.execute.zero's, ZeRO-1 stepping aliases of
    the local shards (LocalShardsOptimizer)."""
    return zero.make_optimizer(pipe, lr, wrap=LocalShardsOptimizer)


def _map_shard_state(state: dict[str, Any], params: list[nn.Parameter], fn: Any, shape: Any) -> dict[str, Any]:
    """`fn(value, parameter)` on every state tensor of a DTensor parameter whose shape is
    `shape(parameter)` (its momentum, variance; not Adam's step), in parameter order."""
    per = dict(state.get("state", {}))
    for i, p in enumerate(params):
        if zero.is_sharded(p) and i in per:
            per[i] = {k: fn(v, p) if isinstance(v, torch.Tensor) and tuple(v.shape) == tuple(shape(p)) else v
                      for k, v in per[i].items()}
    return dict(state, state=per)


def full_optimizer_state(opt: Any, pipe: Any) -> dict[str, Any]:
    """The optimizer state of this rank's stages as full tensors in the model's layout (what a
    checkpoint holds). Collective over the tp group (and the dp group under ZeRO-1)."""
    from torch.distributed.tensor import DTensor


    params, modules = pipe.parameters(), [m.module for m in pipe.modules]
    state = zero.full_optimizer_state(opt, pipe)  # plain optimizer: DTensor state gathered
    if isinstance(opt, LocalShardsOptimizer):  # ZeRO-1: consolidated over dp, still per local shard
        state = _map_shard_state(state, params, lambda v, p: DTensor.from_local(v, p.device_mesh, p.placements).full_tensor(),
                                 lambda p: _local_view(p).shape)
    return unpermute_optimizer_state(state, params, modules)


def load_optimizer_state(opt: Any, state: dict[str, Any], pipe: Any) -> None:
    """Load a full optimizer state in the model's layout (a save of any tp degree) into `opt`."""
    from torch.distributed.tensor import distribute_tensor


    params, modules = pipe.parameters(), [m.module for m in pipe.modules]
    state = permute_optimizer_state(state, params, modules)
    if isinstance(opt, LocalShardsOptimizer):  # its state is per local shard: each rank keeps its own
        state = _map_shard_state(state, params, lambda v, p: distribute_tensor(v, p.device_mesh, p.placements,
                                                                                src_data_rank=None).to_local(),
                                 lambda p: p.shape)
    zero.load_optimizer_state(opt, state)


def _param_orders(params: list[nn.Parameter], modules: list[nn.Module]) -> dict[int, torch.Tensor]:
    """id(parameter) -> its tp row order, for the reordered parameters under `modules`."""
    out: dict[int, torch.Tensor] = {}
    for mod in modules:
        named = dict(mod.named_parameters())
        for key, order in _orders(mod).items():
            if key in named:
                out[id(named[key])] = order
    return out


def unpermute_optimizer_state(state: dict[str, Any], params: list[nn.Parameter], modules: list[nn.Module]) -> dict[str, Any]:
    """An optimizer state_dict of full tensors (indices = positions in `params`) with the state
    of reordered parameters put back in the model's row order."""
    orders = _param_orders(params, modules)
    per = dict(state.get("state", {}))
    for i, p in enumerate(params):
        if id(p) in orders and i in per:
            fixed = {}
            for k, v in per[i].items():
                if isinstance(v, torch.Tensor) and tuple(v.shape) == tuple(p.shape):
                    full = torch.empty_like(v)
                    full[orders[id(p)]] = v
                    v = full
                fixed[k] = v
            per[i] = fixed
    return dict(state, state=per)


def permute_optimizer_state(state: dict[str, Any], params: list[nn.Parameter], modules: list[nn.Module]) -> dict[str, Any]:
    """The inverse of unpermute_optimizer_state: a saved state in model order, in tp order."""
    orders = _param_orders(params, modules)
    per = dict(state.get("state", {}))
    for i, p in enumerate(params):
        if id(p) in orders and i in per:
            per[i] = {k: v[orders[id(p)]] if isinstance(v, torch.Tensor) and tuple(v.shape) == tuple(p.shape) else v
                      for k, v in per[i].items()}
    return dict(state, state=per)


class ShardTracker(MemoryTracker):
    """MemoryTracker for tp blocks, which save DTensors for backward (their inputs, weights and
    outputs inside the block): a DTensor has no storage of its own, so the base class would
    count each one at its global size under its own identity, a weight's transposed view as an
    activation and a replicated input twice. Each is counted by its local shard's storage
    instead, and the tp parameters are excluded by theirs."""

    def __init__(self, exclude: Any = (), **kwargs: Any):
        super().__init__(exclude=[_local_view(t) for t in exclude], **kwargs)

    def exclude(self, tensors: Any) -> None:
        super().exclude(_local_view(t) for t in tensors)

    def probe(self, exclude: Any) -> "ShardTracker":
        """A recompute-transient probe that counts DTensors by their local shard too."""
        return ShardTracker(exclude=exclude)

    def pack(self, t: torch.Tensor) -> Any:
        local = _local_view(t)
        held = super().pack(local)
        if held is local:  # not tracked (a parameter's storage): autograd keeps what it saved
            return t
        held.tensor = t  # unpack hands autograd back the DTensor it saved
        return held
