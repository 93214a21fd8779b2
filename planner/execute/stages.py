"""Cutting the model as planned and choosing what runs the schedule.

Every rank builds the whole model from the plan's spec and seed (so all ranks agree on the weights
without communicating), keeps its stages' layers (a PipeStage each, which sends and receives whatever
structure of tensors crosses its cuts) and wraps the plan's recompute layers in activation checkpointing,
one layer per checkpoint. Chain and traced (non-chain) models take this one path. Ranks are numbered by
the plan's stage order: rank r runs stages r, r + P, ... (torch's loop-style mapping), and reports the
plan device that the first of those stages names.

Schedules: gpipe, 1f1b and interleaved run on torch's own classes (ScheduleGPipe, Schedule1F1B,
ScheduleInterleaved1F1B) when their order equals the planner's; zb (ZB-H1, with split I/W backward) and
any schedule whose order differs run the planner's action lists through torch's CSV-driven runtime
(`_PipelineScheduleRuntime`), which executes exactly what the simulator simulated.
"""

from __future__ import annotations

import csv
import os
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from planner.errors import PlanError
from planner.execute.measure import recorder, tracker
from planner.execute.stage_io import StageExample, boundary_specs, buffers_kept, stage_examples
from planner.execute.weight_backward import retain_graph_in_weight_backward
from planner.limits import OPTIMIZERS
from planner.master_weights import is_16bit, with_fp32_masters
from planner.plan import Plan
from planner.schedules import PipelineSchedule, get_schedule
from planner.torch_compat import private_attr, private_import

__all__ = ["Checkpointed", "StageModule", "rank_device", "stages_of_rank", "build_stage_modules", "PipeStage", "boundary_specs",
           "shared_parameter_groups", "make_schedule", "step_seed", "make_optimizer"]


def step_seed(plan_seed: int, step: int) -> int:
    """Seed of the batch of training step `step` (the reference run uses the same)."""
    return (plan_seed * 1_000_003 + step + 1) % (2**31 - 1)


class Checkpointed(nn.Module):
    """One layer under activation checkpointing (non-reentrant), timed when recomputed."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer

    def forward(self, *args: Any) -> Any:
        tk = tracker()
        if tk is not None and id(self) not in tk.transient_bytes:
            tk.transient_bytes[id(self)] = self._probe(tk, args)
        out = checkpoint(self._run, *args, use_reentrant=False)
        if tk is not None and isinstance(out, torch.Tensor) and args and isinstance(args[0], torch.Tensor):
            # checkpoint keeps its input in a closure, invisible to saved-tensor hooks: make the
            # graph hold it visibly for as long as the checkpoint does (until its backward).
            out = _KeepInput.apply(out, args[0])
        return out

    def _run(self, *args: Any) -> Any:
        rec = recorder()
        if not rec.in_backward():
            return self.layer(*args)
        tk = tracker()
        if tk is not None:
            tk.set_transient(tk.transient_bytes.get(id(self), 0))
        # The recompute is the second forward of this micro-batch: BatchNorm must not count it
        # in its running statistics (the one-process run saw one forward).
        start = time.perf_counter()
        try:
            with buffers_kept(self.layer):
                return self.layer(*args)
        finally:
            rec.add_recompute(time.perf_counter() - start)

    def _probe(self, tk: Any, args: tuple) -> int:
        """Bytes this layer saves for backward when not checkpointed (its recompute transient)."""
        from torch.utils._pytree import tree_leaves, tree_map

        inputs = [a for a in tree_leaves(args) if isinstance(a, torch.Tensor)]
        probe = tk.probe(list(self.parameters()) + inputs)  # counted the way the run counts (tp: local shards)
        with torch.random.fork_rng(devices=[]), torch.enable_grad(), probe, buffers_kept(self.layer):
            out = self.layer(*tree_map(lambda a: a.detach() if isinstance(a, torch.Tensor) else a, args))
            nbytes = probe.live
            del out
        return nbytes


class _KeepInput(torch.autograd.Function):
    """Identity on `out` that saves `x` for backward (so memory tracking sees it)."""

    @staticmethod
    def forward(ctx: Any, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return out.view_as(out)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        return grad, None


@dataclass
class StageModule:
    """One stage's layers on this rank."""

    stage: int
    """Global stage index."""
    first: int
    """First layer (inclusive)."""
    end: int
    """End layer (exclusive)."""
    module: nn.Module
    """What PipelineStage wraps (a PipeStage; recompute layers inside Checkpointed)."""
    layers: list[nn.Module]
    """The original layers, index i = global layer first + i (state dicts use these)."""
    example: StageExample | None = None
    """What the stage receives and returns for one micro-batch (torch's static set-up), when known."""


def rank_device(plan: Plan, rank: int) -> int:
    """The plan device that rank `rank` plays (the device of stage `rank`)."""
    return plan.stages[rank].device


def stages_of_rank(plan: Plan, rank: int) -> list[int]:
    """Global stages that `rank` runs: rank, rank + P, ..."""
    return list(range(rank, plan.n_stages, plan.n_devices))


class PipeStage(nn.Module):
    """Layers [first, end) of the model as one pipeline stage.

    What crosses a cut may be a tensor, a tuple, a dict (a traced model's values) or any nest
    of them: torch's stages send only tensors, so a stage receives the flattened tensors
    (`in_spec` puts the structure back) and sends its output flattened (`out_spec`), every
    tensor contiguous and no view (gloo cannot send a transposed view; zero-bubble schedules
    detach outputs in place, which a view refuses). The first stage takes the model input as
    it is, the last returns the model output in its structure (copied under split backwards: `copy_outputs`).
    """

    def __init__(self, layers: list[nn.Module], in_spec: Any, out_spec: Any, copy_outputs: bool = False):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.in_spec, self.out_spec, self.copy_outputs = in_spec, out_spec, copy_outputs

    def forward(self, *args: Any) -> Any:
        from torch.utils._pytree import tree_flatten, tree_unflatten

        if self.in_spec is None:
            h: Any = args[0] if len(args) == 1 else args
        else:
            # torch sends the gradients of these back: they must be contiguous too
            h = tree_unflatten([_ContiguousGrad.apply(a) if a.requires_grad else a for a in args], self.in_spec)
        for layer in self.layers:
            seen, h = h, layer(h)
        leaves, spec = tree_flatten(h)
        if self.out_spec is None:
            # torch's I step detaches these in place, W may read one a layer saved (`(logits, hidden)`): copies, each once
            copies = {id(t): t.clone() for t in leaves if self.copy_outputs and isinstance(t, torch.Tensor) and not t._is_view()}
            return tree_unflatten([copies.get(id(t), t) for t in leaves], spec) if copies else h
        # Copied: views and values passed on from the last layer's input (torch's I step detaches outputs in place; W reads them)
        passed = {id(t) for t in tree_flatten(seen)[0]}
        leaves = [t.clone(memory_format=torch.contiguous_format) if t._base is not None or id(t) in passed else t.contiguous() for t in leaves]
        return leaves[0] if len(leaves) == 1 else tuple(leaves)


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose backward makes the gradient contiguous (a received tensor's expanded or transposed one cannot be sent back)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad.contiguous()


def _leaf_spec() -> Any:
    """torch's tree spec of one tensor: `treespec_leaf()` where torch has it (constructing LeafSpec
    warns from torch 2.13), else `LeafSpec()` (older torch)."""
    from torch.utils import _pytree

    make = getattr(_pytree, "treespec_leaf", None)
    return make() if make is not None else _pytree.LeafSpec()


def _cut_specs(plan: Plan, s: int, specs: list[tuple[Any, list[str]]] | None) -> tuple[Any, Any]:
    """(in_spec, out_spec) of stage `s`'s PipeStage: what crosses its cuts (None: the model's own
    input or output), from boundary_specs; without them, one tensor at each cut."""
    first, stop = plan.stages[s].layers
    end = plan.stages[-1].layers[1]
    if specs is None:
        leaf = _leaf_spec()
        return (leaf if first > 0 else None), (leaf if stop < end else None)
    for c in (first - 1, stop - 1):
        if 0 <= c < len(specs) and specs[c][1]:
            raise PlanError(f"model {plan.model!r}: the cut after layer {c} would have to send {', '.join(specs[c][1])} "
                            "values, but pipeline stages send only tensors",
                            "cut elsewhere (edit the plan's stages) or make the model compute that value in the layer that reads it")
    return (specs[first - 1][0] if first > 0 else None), (specs[stop - 1][0] if stop < end else None)


def _pipe_stage(plan: Plan, s: int, layers: list[nn.Module], specs: list[tuple[Any, list[str]]] | None) -> PipeStage:
    first, stop = plan.stages[s].layers
    copy_outputs = first > 0 and stop == plan.stages[-1].layers[1] and get_schedule(plan.schedule).split_backward  # torch detaches only these outputs
    return PipeStage(layers, *_cut_specs(plan, s, specs), copy_outputs)


def build_stage_modules(plan: Plan, layers: nn.Sequential, rank: int, example: Any = None) -> list[StageModule]:
    """Cut `layers` as planned and keep this rank's stages (PipeStage modules).

    `example` is one micro-batch of the model input: with it, what crosses each cut is found
    by one forward (boundary_specs), so layers may pass tuples, dicts (a traced model) or views,
    and a second through every stage gives each the tensors it receives and returns
    (StageModule.example, planner.execute.stage_io); without it every cut carries one tensor.
    """
    children = list(layers.children())
    end = plan.stages[-1].layers[1]
    if len(children) != end:
        raise PlanError(f"plan covers {end} layers but model {plan.model!r} has {len(children)}",
                        "re-plan from a profile of this model")
    specs = boundary_specs(layers, example) if example is not None else None
    out = []
    for s in stages_of_rank(plan, rank):
        (first, stop), rec = plan.stages[s].layers, set(plan.stages[s].recompute)
        kept = children[first:stop]
        wrapped = [Checkpointed(layer) if first + i in rec else layer for i, layer in enumerate(kept)]
        out.append(StageModule(stage=s, first=first, end=stop, module=_pipe_stage(plan, s, wrapped, specs), layers=kept))
    if specs is not None:
        # every stage, its layers as they compute (recompute changes memory, not what a stage returns)
        every = [_pipe_stage(plan, s, children[slice(*st.layers)], specs) for s, st in enumerate(plan.stages)]
        found = stage_examples(layers, every, example, plan.micro_batch_size, {m.stage for m in out})
        for m in out:
            m.example = found[m.stage] if found is not None else None
    return out


def shared_parameter_groups(plan: Plan, layers: nn.Sequential) -> list[tuple[list[int], list[Any]]]:
    """(ranks, the shared parameters of that rank set) for parameters whose layers sit on
    several ranks, in an order every rank computes alike (every rank builds the whole model)."""
    stage_of = {i: s for s, st in enumerate(plan.stages) for i in range(*st.layers)}
    params: dict[int, Any] = {}  # by first appearance, the same order on every rank
    holders: dict[int, set[int]] = {}
    for i, child in enumerate(layers.children()):
        for p in child.parameters():
            params.setdefault(id(p), p)
            holders.setdefault(id(p), set()).add(stage_of[i] % plan.n_devices)
    groups: dict[tuple[int, ...], list[Any]] = {}
    for pid, p in params.items():
        if len(holders[pid]) > 1:
            groups.setdefault(tuple(sorted(holders[pid])), []).append(p)
    return [(list(r), ps) for r, ps in groups.items()]


def _compute_order(order: dict[int, list[Any]]) -> dict[int, list[str]]:
    """rank -> torch actions as strings, idle slots and non-compute actions dropped."""
    return {rank: [str(a) for a in acts if a is not None and a.computation_type.value in ("F", "B", "I", "W")]
            for rank, acts in order.items()}


def make_schedule(plan: Plan, stages: list[Any], loss_fn: Any, prefer_torch: bool = True) -> tuple[Any, str]:
    """(torch schedule object, a name for the run record) running exactly the planner's order.

    ScheduleGPipe and Schedule1F1B execute a fixed order written in their code (their
    `_get_pipeline_order` is only a drawing, and torch 2.13's 1F1B drawing is off by one on
    later ranks), which the planner's generators reproduce; train.check_executed_order verifies it
    on the first step. ScheduleInterleaved1F1B executes its `pipeline_order`, compared here."""
    from torch.distributed import pipelining

    sched = plan.pipeline_schedule()
    spec = get_schedule(plan.schedule)
    M = plan.n_microbatches
    _scale_each_parameter_once(sched, stages)
    if spec.split_backward:
        retain_graph_in_weight_backward(stages)
    if prefer_torch and spec.torch_runtime in ("class", "class-if-same-order"):
        cls = getattr(pipelining, spec.torch_class)
        # single-stage classes take this rank's one stage, multi-chunk ones the list
        obj = cls(stages if spec.multi_chunk else stages[0], M, loss_fn=loss_fn)
        if spec.torch_runtime == "class":
            return obj, spec.torch_class
        want = {r: [str(a) for a in sched.actions(r)] for r in range(sched.n_ranks)}
        if _compute_order(obj.pipeline_order) == want:
            return obj, spec.torch_class
    runtime_class = private_import("torch.distributed.pipelining.schedules", "_PipelineScheduleRuntime", "torch")
    runtime = runtime_class(stages, M, loss_fn=loss_fn)
    fd, path = tempfile.mkstemp(prefix="pplan-schedule-", suffix=".csv")
    try:
        with os.fdopen(fd, "w", newline="") as fh:
            csv.writer(fh).writerows(sched.to_csv_rows())
        private_attr(runtime, "_load_csv", "torch")(path)
    finally:
        os.unlink(path)
    return runtime, "_PipelineScheduleRuntime(plan actions)"


def _scale_each_parameter_once(sched: PipelineSchedule, stages: list[Any]) -> None:
    """On a rank with several stages, make torch divide each gradient by M once per step.

    torch calls `scale_grads(M)` on a stage after its last backward, dividing every gradient of
    its module: a parameter two stages of one rank share (a module called in two places, on
    stages s and s + P of an interleaved plan) would be divided twice, the first time before the
    other stage's last contributions. So a shared parameter is scaled only by the stage whose
    last weight-gradient action (B or W) comes last in this rank's order."""
    if len(stages) < 2:
        return
    last = {a.stage: pos for pos, a in enumerate(sched.actions(sched.stage_rank[stages[0].stage_index])) if a.kind in ("B", "W")}
    owner = {id(p): st for st in sorted(stages, key=lambda st: last.get(st.stage_index, -1)) for p in st.submod.parameters()}
    for st in stages:
        own = [p for p in st.submod.parameters() if owner[id(p)] is st]
        if len(own) < len(list(st.submod.parameters())):
            def scale_grads(factor: int, own: list[Any] = own) -> None:  # torch's, restricted to `own`
                for p in own:
                    if factor != 1 and p.grad is not None:
                        p.grad.div_(factor)

            st.scale_grads = scale_grads


class _NoParameters:
    """The optimizer of a rank whose stages hold no parameters (activations, pooling, Flatten):
    torch's optimizers refuse an empty parameter list, and there is nothing to step or save."""

    state: dict = {}
    param_groups: list = []

    def step(self, closure: Any = None) -> None:
        """Nothing to update."""

    def zero_grad(self, set_to_none: bool = True) -> None:
        """No gradients to clear."""

    def state_dict(self) -> dict[str, Any]:
        return {"state": {}, "param_groups": []}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("state") or state.get("param_groups"):
            raise ValueError("the saved optimizer has parameters but this rank's stages hold none")


# One builder for each name of planner.limits.OPTIMIZERS (tests/test_one_home_per_constant.py builds every one).
_OPTIMIZERS: dict[str, tuple[type, dict[str, Any]]] = {
    "adam": (torch.optim.Adam, {}), "adamw": (torch.optim.AdamW, {}),
    "sgd": (torch.optim.SGD, {"momentum": 0.9}), "sgd-plain": (torch.optim.SGD, {})}


def make_optimizer(name: str, params: list[nn.Parameter], lr: float) -> Any:
    """The plan's optimizer over `params` (sgd = SGD with momentum 0.9); one that does nothing
    when `params` is empty (a stage of parameter-free layers). Over 16-bit parameters (a bfloat16
    plan) it steps fp32 master copies of them (planner.master_weights: mixed precision, as the
    cost model prices it); over float32 ones it is torch's class itself."""
    if name not in _OPTIMIZERS:
        raise PlanError(f"plan optimizer {name!r} is unknown", f"use {', '.join(OPTIMIZERS)}")
    if not params:
        return _NoParameters()
    cls, settings = _OPTIMIZERS[name]
    if any(is_16bit(p) for p in params):
        cls = with_fp32_masters(cls)
    return cls(params, lr=lr, **settings)
