"""Cutting the model as planned and choosing what runs the schedule.

Every rank builds the whole model from the plan's spec and seed (so all ranks agree on the
weights without communicating), keeps its stages' layers and wraps the plan's recompute layers
in activation checkpointing, one layer per checkpoint. Ranks are numbered by the plan's stage
order: rank r runs stages r, r + P, r + 2P, ... (torch's loop-style mapping), and reports the
plan device that the first of those stages names.

Schedules: gpipe, 1f1b and interleaved run on torch's own classes (ScheduleGPipe,
Schedule1F1B, ScheduleInterleaved1F1B) when their order equals the planner's; zb (ZB-H1, with
split I/W backward) and any schedule whose order differs run the planner's action lists through
torch's CSV-driven runtime (`_PipelineScheduleRuntime`), which executes exactly what the
simulator simulated.
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

from planner.errors import PlanError, RunError
from planner.execute.measure import recorder, tracker
from planner.plan import Plan
from planner.schedules import SCHEDULE_NAMES, PipelineSchedule, generate, get_schedule

__all__ = [
    "Checkpointed",
    "StageModule",
    "rank_device",
    "stages_of_rank",
    "build_stage_modules",
    "is_non_chain",
    "non_chain_unsupported",
    "build_traced_stages",
    "plan_schedule",
    "make_schedule",
    "check_executed_order",
    "step_seed",
    "make_optimizer",
]


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
        start = time.perf_counter()
        try:
            return self.layer(*args)
        finally:
            rec.add_recompute(time.perf_counter() - start)

    def _probe(self, tk: Any, args: tuple) -> int:
        """Bytes this layer saves for backward when not checkpointed (its recompute transient)."""
        from planner.execute.measure import MemoryTracker

        probe = MemoryTracker(exclude=list(self.parameters()) + [a for a in args if isinstance(a, torch.Tensor)])
        with torch.random.fork_rng(devices=[]), torch.enable_grad(), probe:
            out = self.layer(*[a.detach() for a in args if isinstance(a, torch.Tensor)])
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
    module: nn.Sequential
    """What PipelineStage wraps (recompute layers inside Checkpointed)."""
    layers: list[nn.Module]
    """The original layers, index i = global layer first + i (state dicts use these)."""


def rank_device(plan: Plan, rank: int) -> int:
    """The plan device that rank `rank` plays (the device of stage `rank`)."""
    return plan.stages[rank].device


def stages_of_rank(plan: Plan, rank: int) -> list[int]:
    """Global stages that `rank` runs: rank, rank + P, ..."""
    return list(range(rank, plan.n_stages, plan.n_devices))


def build_stage_modules(plan: Plan, layers: nn.Sequential, rank: int) -> list[StageModule]:
    """Cut `layers` as planned and keep this rank's stages."""
    children = list(layers.children())
    end = plan.stages[-1].layers[1]
    if len(children) != end:
        raise PlanError(f"plan covers {end} layers but model {plan.model!r} has {len(children)}",
                        "re-plan from a profile of this model")
    out = []
    for s in stages_of_rank(plan, rank):
        st = plan.stages[s]
        first, stop = st.layers
        kept = children[first:stop]
        rec = set(st.recompute)
        wrapped = [Checkpointed(layer) if first + i in rec else layer for i, layer in enumerate(kept)]
        out.append(StageModule(stage=s, first=first, end=stop, module=nn.Sequential(*wrapped), layers=kept))
    return out


def is_non_chain(layers: nn.Module) -> bool:
    """Whether `layers` is a traced model with skip edges (a GraphSequential of a non-chain model)."""
    graph = getattr(layers, "graph", None)
    return graph is not None and bool(graph.skip_edges)


def non_chain_unsupported(plan: Plan) -> str | None:
    """Why `plan` cannot run on traced (pipeline()-split) stages, or None when it can."""
    if not get_schedule(plan.schedule).non_chain or plan.n_stages != plan.n_devices:
        allowed = [n for n in SCHEDULE_NAMES if get_schedule(n).non_chain]
        return (f"schedule {plan.schedule!r} with {plan.n_stages} stages on {plan.n_devices} devices: "
                f"only {' and '.join(allowed)} with one stage per device run non-chain models")
    if any(st.recompute for st in plan.stages):
        return "recompute layers: activation checkpointing inside a traced stage is not supported yet"
    return None


class _LayerView:
    """Layer i of a traced stage for state dicts: the stage module's entries under layer i's keys."""

    def __init__(self, stage_module: nn.Module, keys: list[str]):
        self.module, self.keys = stage_module, keys

    def state_dict(self) -> dict[str, torch.Tensor]:
        sd = self.module.state_dict()
        return {k: sd[k] for k in self.keys}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        missing = set(self.keys) - set(state)
        if missing:
            raise RunError(f"checkpoint lacks {sorted(missing)[:3]} for a traced stage", "resume with the plan it was saved by")
        self.module.load_state_dict(state, strict=False)


def build_traced_stages(plan: Plan, bundle: Any, rank: int, device: torch.device,
                        group: Any = None) -> tuple[list[StageModule], list[Any]]:
    """A non-chain model's stages on this rank: torch's pipeline() split at the plan's cuts.

    Exports the user's module (`bundle.layers.source`) on one micro-batch, splits it with
    `split_policy(lg, cuts)` (skip tensors relayed stage to stage) and builds this rank's
    PipelineStage. StageModule.module is the traced stage module; StageModule.layers gives
    per-layer state dicts (layer i owns the keys of `bundle.layers[i]`) for checkpoints.
    """
    from torch.distributed.pipelining import pipeline

    from planner.graph.pipe import split_policy

    why = non_chain_unsupported(plan)
    if why is not None:
        raise PlanError(f"model {plan.model!r} is not a chain and the plan has {why}",
                        "re-plan with --schedule gpipe or 1f1b, one stage per device and --recompute none")
    lg = bundle.layers.graph
    if lg.n_layers != plan.stages[-1].layers[1]:
        raise PlanError(f"plan covers {plan.stages[-1].layers[1]} layers but model {plan.model!r} has {lg.n_layers}",
                        "re-plan from a profile of this model")
    cuts = [st.layers[1] - 1 for st in plan.stages[:-1]]
    x = bundle.make_batch(plan.micro_batch_size, 0)[0]
    pipe = pipeline(bundle.layers.source, tuple(x) if isinstance(x, (tuple, list)) else (x,),
                    split_policy=split_policy(lg, cuts))
    if pipe.num_stages != plan.n_stages:
        raise RunError(f"pipeline() made {pipe.num_stages} stages of the plan's {plan.n_stages}",
                       "report this model: the traced split differs from the plan")
    children = list(bundle.layers.children())
    mods, stages = [], []
    for s in stages_of_rank(plan, rank):
        first, stop = plan.stages[s].layers
        sub = pipe.get_stage_module(s).to(device)
        views = [_LayerView(sub, list(children[i].state_dict())) for i in range(first, stop)]
        mods.append(StageModule(stage=s, first=first, end=stop, module=sub, layers=views))
        stages.append(pipe.build_stage(s, device, group))
    return mods, stages


def plan_schedule(plan: Plan) -> PipelineSchedule:
    """The planner's schedule for `plan` (what the simulator simulated)."""
    return generate(plan.schedule, plan.n_devices, plan.n_microbatches, plan.virtual_stages)


def _compute_order(order: dict[int, list[Any]]) -> dict[int, list[str]]:
    """rank -> torch actions as strings, idle slots and non-compute actions dropped."""
    keep = ("F", "B", "I", "W")
    return {rank: [str(a) for a in acts if a is not None and a.computation_type.value in keep]
            for rank, acts in order.items()}


def make_schedule(plan: Plan, stages: list[Any], loss_fn: Any, prefer_torch: bool = True) -> tuple[Any, str]:
    """(torch schedule object, a name for the run record) running exactly the planner's order.

    ScheduleGPipe and Schedule1F1B execute a fixed order written in their code (their
    `_get_pipeline_order` is only a drawing, and torch 2.13's 1F1B drawing is off by one on
    later ranks), which the planner's generators reproduce; `check_executed_order` verifies it
    on the first step. ScheduleInterleaved1F1B executes its `pipeline_order`, compared here.
    """
    from torch.distributed import pipelining
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

    sched = plan_schedule(plan)
    spec = get_schedule(plan.schedule)
    M = plan.n_microbatches
    if prefer_torch and spec.torch_runtime in ("class", "class-if-same-order"):
        cls = getattr(pipelining, spec.torch_class)
        # single-stage classes take this rank's one stage, multi-chunk ones the list
        obj = cls(stages if spec.multi_chunk else stages[0], M, loss_fn=loss_fn)
        if spec.torch_runtime == "class":
            return obj, spec.torch_class
        want = {r: [str(a) for a in sched.actions(r)] for r in range(sched.n_ranks)}
        if _compute_order(obj.pipeline_order) == want:
            return obj, spec.torch_class
    runtime = _PipelineScheduleRuntime(stages, M, loss_fn=loss_fn)
    fd, path = tempfile.mkstemp(prefix="pplan-schedule-", suffix=".csv")
    try:
        with os.fdopen(fd, "w", newline="") as fh:
            csv.writer(fh).writerows(sched.to_csv_rows())
        runtime._load_csv(path)
    finally:
        os.unlink(path)
    return runtime, "_PipelineScheduleRuntime(plan actions)"


def check_executed_order(plan: Plan, rank: int, events: list[Any]) -> None:
    """Raise RunError unless this rank's compute ran in the planner's order."""
    want = [str(a) for a in plan_schedule(plan).actions(rank)]
    got = [f"{e.stage}{e.kind}{e.microbatch}" for e in events if e.kind in ("F", "B", "I", "W")]
    if got != want:
        i = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        raise RunError(f"rank {rank} executed {' '.join(got[max(0, i - 2):i + 3])} where the plan has "
                       f"{' '.join(want[max(0, i - 2):i + 3])} (action {i})", "report this: torch's schedule differs from the simulated one")


def make_optimizer(name: str, params: list[nn.Parameter], lr: float) -> torch.optim.Optimizer:
    """The plan's optimizer over `params` (sgd = SGD with momentum 0.9)."""
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    if name == "sgd-plain":
        return torch.optim.SGD(params, lr=lr)
    raise PlanError(f"plan optimizer {name!r} is unknown", "use adam, adamw, sgd or sgd-plain")
