"""One rank's training loop: build its stages, run the schedule for N steps, measure.

Step timing: all ranks meet at a barrier before each step; a rank's step time runs from leaving
the barrier to the end of its optimizer step, and the step's time is the slowest rank's (an
all-reduce of the maxima, outside the timed region). Synthetic data: step k trains on
make_batch(global batch, step_seed(seed, k)), so a resumed run sees the same data.

Random numbers and checkpoints: planner.execute.rankstate (seeded per rank; a resumed run
continues the uninterrupted one bit for bit).

Divergence: when the loss of a step is not finite (inf/NaN), every rank stops after that step
(the flag travels with the step-time all-reduce) and no checkpoint of the diverged weights is
saved; the measurement's `diverged_step` says where.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from planner.execute.checkpoint import SaveSteps
from planner.execute.measure import MemoryTracker, RssWindow, mark_baseline, recorder, set_tracker
from planner.execute.measurement import CommMeasurement, RankMeasurement, RankMemory
from planner.execute.options import RunOptions
from planner.execute.pipeline import build_pipeline
from planner.execute.rankstate import resume_rank, rng_state, save_rank, seed_rank, set_rng_state
from planner.execute import tensor, zero
from planner.execute.stages import step_seed
from planner.execute.steplog import StepLog, rank_measurement
from planner.errors import RunError
from planner.models.hf_release import release_other_layers
from planner.plan import MemoryRecord, Plan
from planner.profiling.allocpeak import CpuAllocatorMeter
from planner.profiling.saved import storage_key, tensor_bytes
from planner.profiling.stageloss import compact_loss

__all__ = ["train_rank", "check_executed_order"]

def _to(obj: Any, device: torch.device, copy: bool = False) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.to(device, copy=copy)
    if isinstance(obj, (tuple, list)):
        return type(obj)(_to(o, device, copy) for o in obj)
    return obj


def _progress(text: str) -> None:
    sys.stderr.write(f"[pplan] {text}\n")
    sys.stderr.flush()


_METADATA_INFERENCE = ("_forward_metadata_inference", "_backward_metadata_inference", "_shape_inference")


def _rng_neutral(stage: Any, device: torch.device) -> None:
    """Make torch's metadata inference (an extra forward/backward of the stage module on its
    first step, in torch's private methods) leave every random generator and every module
    buffer (BatchNorm's running statistics) as it found it: a
    run resumed at step k would otherwise draw different dropout masks at step k than the
    uninterrupted run, which did that inference at step 0."""
    for name in _METADATA_INFERENCE:
        fn = getattr(stage, name, None)
        if not callable(fn):
            continue

        def neutral(*args: Any, _fn: Any = fn, **kwargs: Any) -> Any:
            saved = rng_state(device)
            # it runs the stage on placeholder tensors: BatchNorm statistics must not see them
            buffers = [(b, b.detach().clone()) for b in stage.submod.buffers()]
            try:
                return _fn(*args, **kwargs)
            finally:
                set_rng_state(saved, device)
                with torch.no_grad():
                    for b, kept in buffers:
                        b.copy_(kept)

        setattr(stage, name, neutral)


def train_rank(plan: Plan, opts: RunOptions, rank: int, world: int, device: torch.device,
               model_kwargs: dict[str, Any] | None = None, resume: dict[str, Any] | None = None) -> RankMeasurement:
    """Train this rank's stages; returns what it measured (gathered by rank 0).

    `resume` ({"step": k, "folder": path}, chosen once by run_plan) is the save to continue
    from; without it the newest intact save in opts.checkpoint_dir is used.
    """
    from planner.allocator import keep_freed_memory

    keep_freed_memory()  # reuse freed host memory step after step, as the profile's loops do
    mark_baseline()  # the process's RSS before the model: what the rank's memory grows from
    # On CPU torch's allocator counts from here, so the model's own tensors are in its peak.
    meter = CpuAllocatorMeter().start() if opts.track_memory and device.type == "cpu" else None
    try:
        return _train(plan, opts, rank, world, device, model_kwargs, resume, meter)
    finally:
        if meter is not None:
            meter.stop()


@dataclass(frozen=True)
class _RankSetup:
    """One rank, ready to train: its stages, what measures them, and where training starts."""

    bundle: Any
    """The built model (its make_batch gives every step's data)."""
    pipe: Any
    """build_pipeline's Pipeline: this rank's stages, schedule and process groups."""
    rec: Any
    """The action recorder over the stages and the loss."""
    params: list[Any]
    """This rank's parameters, a tied weight once."""
    opt: Any
    """The optimizer (ZeRO-1: sharded over the replicas)."""
    boundary: dict[int, list[int]]
    """stage -> [input bytes, output bytes] of one micro-batch (filled by each stage's first forward)."""
    start_step: int
    """The first step to train (a resumed run's save step, else 0)."""
    loss_log: dict[int, float]
    """step -> loss on a last-stage rank, filled step by step (a resumed run's earlier ones included)."""
    comm: list[CommMeasurement]
    """Ping-pong times to the neighbour ranks (--calibrate), else empty."""
    mem_step: int
    """The step whose memory is measured (-1 when memory is not tracked)."""


def _set_up_rank(plan: Plan, opts: RunOptions, rank: int, world: int, device: torch.device,
                 model_kwargs: dict[str, Any] | None, resume: dict[str, Any] | None) -> _RankSetup:
    """Build the model and this rank's stages, instrument them, make the optimizer, seed, resume."""
    from planner.models import build_model

    bundle = build_model(plan.model, seed=plan.seed, **(model_kwargs or {}))
    # One micro-batch shows what crosses each cut (tensors, tuples, a traced model's dicts).
    example = bundle.make_batch(plan.micro_batch_size, 0)[0]
    # The library entry users call from their own loops: stages, schedule, tied-weight groups, mesh.
    pipe = build_pipeline(plan, bundle.layers, rank=rank, device=device, loss_fn=compact_loss(bundle.loss_fn), example=example,
                          prefer_torch=opts.prefer_torch)
    # Other ranks' layers are not needed here: let them go (the stages hold this rank's), and
    # their weights inside a Hugging Face model, which this rank's layers keep for its code.
    release_other_layers(bundle.layers, pipe.parameters())
    boundary = _record_boundaries(list(pipe.modules))
    rec = _instrument(pipe, device)
    params = pipe.parameters()  # a tied weight once
    opt = pipe.make_optimizer(opts.lr)  # ZeRO-1: sharded over the replicas
    seed_rank(plan.seed, rank)
    start_step, loss_log = resume_rank(plan, opts, pipe, opt, rank, device, resume, _progress)
    comm = _comm(rank, world, device) if opts.calibrate and world > 1 else []
    # Memory is measured in the last warm-up step, and never in a fresh run's first: torch creates
    # the optimizer's state at the first optimizer step, so that step's peak lacks it.
    mem_step = min(opts.steps - 1, start_step + max(1, opts.warmup - 1)) if opts.track_memory else -1
    return _RankSetup(bundle=bundle, pipe=pipe, rec=rec, params=params, opt=opt, boundary=boundary,
                      start_step=start_step, loss_log=loss_log, comm=comm, mem_step=mem_step)


def _train(plan: Plan, opts: RunOptions, rank: int, world: int, device: torch.device,
           model_kwargs: dict[str, Any] | None, resume: dict[str, Any] | None,
           meter: CpuAllocatorMeter | None) -> RankMeasurement:
    r = _set_up_rank(plan, opts, rank, world, device, model_kwargs, resume)
    pipe, n_steps = r.pipe, opts.steps
    log = StepLog()
    probes: dict[int, int] = {}
    for step in range(r.start_step, n_steps):
        x, y = _step_batch(plan, r, step, device)
        tk = _start_tracking(opts, r, step, x, y, probes, device)
        measured = tk is not None and step == r.mem_step
        t0, t1, grad_bytes, sync_ms, losses, window = _timed_step(pipe, r.rec, r.opt, r.params, x, y, tk, device,
                                                                   rss=measured, meter=meter if measured else None)
        log.allreduce_ms.append(sync_ms)
        if step == r.start_step:
            check_executed_order(plan, pipe.pp_index, r.rec.events)
        if tk is not None:
            set_tracker(None)
            if measured:
                log.memory = _memory(r, tk, grad_bytes, window, meter, device, batch=(x, y))
        step_ms, diverged = _agree_on_step(r, step, (t1 - t0) * 1e3, losses, device)
        log.add_step(step_ms, t0, r.rec.events)
        if pipe.is_last and pipe.dp_index == 0 and pipe.tp_index == 0:
            _progress(f"step {step + 1}/{n_steps}  loss {r.loss_log[step]:.6f}  {step_ms:.1f} ms")
        if diverged:
            log.diverged_step = step  # stop here; the diverged weights are not checkpointed
            break
        if _checkpoint_due(opts, done=step + 1):
            save_rank(opts.checkpoint_dir, step + 1, rank, world, pipe, r.opt, r.loss_log, device)
    return rank_measurement(plan, pipe, rank, log, start_step=r.start_step, loss_log=r.loss_log, comm=r.comm,
                            boundary=r.boundary, warmup=opts.warmup, mem_step=r.mem_step)


def _step_batch(plan: Plan, r: _RankSetup, step: int, device: torch.device) -> tuple[Any, Any]:
    """Step `step`'s (inputs, targets) for this rank: its replica's slice, on its device."""
    pipe = r.pipe
    x, y = r.bundle.make_batch(plan.global_batch, step_seed(plan.seed, step))
    # only the first stage's rank feeds the inputs and only the last's the targets: elsewhere
    # the batch would sit in memory for the whole step (the cost model charges it where it is used).
    # A replica's slice is a view of the global batch: copied, else on CPU it keeps all dp slices alive
    copy = pipe.dp > 1
    return (_to(pipe.local_batch(x), device, copy) if pipe.is_first else None,
            _to(pipe.local_batch(y), device, copy) if pipe.is_last else None)


def _start_tracking(opts: RunOptions, r: _RankSetup, step: int, x: Any, y: Any, probes: dict[int, int],
                    device: torch.device) -> MemoryTracker | None:
    """The memory tracker of this step, installed, on the first step and the memory step; else None."""
    if not (opts.track_memory and step in (r.start_step, r.mem_step)):
        return None
    # the first step only measures what checkpointed layers hold while recomputed. The receive
    # buffers (there from the first step on) are the buffers' part, not the activations', also
    # where a stage's first layer saves its input: the storage is the buffer's
    batch = [t for t in (x, y) if isinstance(t, torch.Tensor)]
    tk = _tracker(r.pipe, r.params + batch + _receive_buffers(r.pipe.stages), probes)
    set_tracker(tk)
    if step == r.mem_step and device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    return tk


def _agree_on_step(r: _RankSetup, step: int, local_ms: float, losses: list[Any],
                   device: torch.device) -> tuple[float, bool]:
    """(the step's time, the slowest rank's; whether any rank's loss was not finite): the last
    stage logs the step's loss first, then every rank learns both in one all-reduce, outside
    the timing."""
    bad = 0.0
    if r.pipe.is_last:
        r.loss_log[step] = _step_loss(losses, r.pipe, device)
        bad = 0.0 if math.isfinite(r.loss_log[step]) else 1.0
    local = torch.tensor([local_ms, bad], dtype=torch.float64, device=device)  # NCCL: on the GPU
    dist.all_reduce(local, op=dist.ReduceOp.MAX)
    return float(local[0].item()), float(local[1].item()) > 0


def check_executed_order(plan: Plan, rank: int, events: list[Any]) -> None:
    """Raise RunError unless this rank's compute ran in the planner's order."""
    want = [str(a) for a in plan.pipeline_schedule().actions(rank)]
    got = [f"{e.stage}{e.kind}{e.microbatch}" for e in events if e.kind in ("F", "B", "I", "W")]
    if got != want:
        i = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        raise RunError(f"rank {rank} executed {' '.join(got[max(0, i - 2):i + 3])} where the plan has "
                       f"{' '.join(want[max(0, i - 2):i + 3])} (action {i})", "report this: torch's schedule differs from the simulated one")


def _comm(rank: int, world: int, device: torch.device) -> list[CommMeasurement]:
    from planner.execute.commbench import benchmark_neighbours

    return [CommMeasurement.from_dict(c, f"rank {rank}'s ping-pong") for c in benchmark_neighbours(rank, world, device)]


def _checkpoint_due(opts: RunOptions, done: int) -> bool:
    """Whether to save after `done` steps: at the end of the run, and every --checkpoint-every steps."""
    return bool(opts.checkpoint_dir) and done in SaveSteps(0, opts.steps, opts.checkpoint_every or 0)


def _receive_buffers(stages: Any) -> list[torch.Tensor]:
    """The receive buffers torch's PipelineStages allocate at their first step and keep: one per
    micro-batch for each activation a stage receives and one for each gradient of its output
    (planner.cost.buffer_bytes prices them; none before the first step)."""
    buffers = []
    for st in stages:
        for per_microbatch in (getattr(st, "args_recv_info", {}), getattr(st, "grad_recv_info", {})):
            for infos in per_microbatch.values():
                buffers += [info.buffer for info in infos if isinstance(getattr(info, "buffer", None), torch.Tensor)]
    return buffers


def _buffer_bytes(stages: Any, batch: Any) -> int:
    """The boundary buffers the rank holds through a step, each storage once: the stages' receive
    buffers (M x (bytes in + bytes out)) and the step's batch where it is used: the inputs on the
    first stage's rank, the targets on the last's, which torch's schedule splits into micro-batches
    that are views of them (M x the model input, M x the target): what the cost model's buffers
    are (planner.cost.buffer_bytes, planner.cost.batch)."""
    tensors = _receive_buffers(stages) + _tensors(batch)
    return sum(dict(storage_key(t) for t in tensors).values())


def _tensors(obj: Any) -> list[torch.Tensor]:
    """The tensors of a batch: a tensor, or those in a tuple, list or dict of them (a model's inputs)."""
    if isinstance(obj, (tuple, list, dict)):
        return [t for o in (obj.values() if isinstance(obj, dict) else obj) for t in _tensors(o)]
    return [obj] if isinstance(obj, torch.Tensor) else []


def _memory(r: _RankSetup, tk: MemoryTracker, grad_bytes: int, window: RssWindow | None,
            meter: CpuAllocatorMeter | None, device: torch.device, batch: Any) -> RankMemory:
    """The memory step's measurement, taken right after it: what the rank holds (weights, gradients,
    optimizer; ZeRO-aware), the tracker's peaks, the boundary buffers (`batch`: the step's (inputs,
    targets), each None on a rank that does not use it), the allocator's peak (its counting ends here) and the
    RSS window."""
    allocated = meter.stop() if meter is not None else None  # counting ends with the measured step
    held = zero.held_bytes(r.pipe, r.opt, grad_bytes)
    # weights, gradients, optimizer (ZeRO: held_bytes), activations, buffers
    parts = {**held, "activations": tk.peak, "buffers": _buffer_bytes(r.pipe.stages, batch)}
    tracked = MemoryRecord(**parts, total=sum(parts.values()))
    rss = {"rss_baseline_bytes": window.baseline, "rss_growth_bytes": window.growth_bytes} if window is not None else {}
    if device.type == "cuda":
        return RankMemory(measure="cuda-allocator", peak_bytes=int(torch.cuda.max_memory_allocated(device)),
                          breakdown=tracked, transient_bytes=tk.peak_transient, **rss)
    import resource

    # torch's allocator's own count where the profiler gave one; else the tensors' sizes
    return RankMemory(measure="cpu-allocator" if allocated is not None else "tracked",
                      peak_bytes=allocated.peak_bytes if allocated is not None else tracked.total,
                      breakdown=tracked, transient_bytes=tk.peak_transient,
                      rss_peak_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, **rss)


def _record_boundaries(mods: list[Any]) -> dict[int, list[int]]:
    """stage -> [input bytes, output bytes] of one micro-batch, filled by each stage's first
    forward (a hook that removes itself)."""
    boundary: dict[int, list[int]] = {}
    for m in mods:
        boundary[m.stage] = [0, 0]
        handles: list[Any] = []

        def hook(mod: Any, args: Any, out: Any, s: int = m.stage, handles: list = handles) -> None:
            boundary[s] = [tensor_bytes(args), tensor_bytes(out)]
            handles[0].remove()

        handles.append(m.module.register_forward_hook(hook))
    return boundary


def _tracker(pipe: Any, exclude: list[Any], probes: dict[int, int]) -> MemoryTracker:
    """The memory tracker of a measured step: ZeRO-2/3 counts the weights it gathers, tensor
    parallelism counts DTensors by their local shards, else tensors as they are."""
    kw = dict(exclude=exclude, transient_bytes=probes)
    if pipe.zero >= 2:
        return zero.GatheredWeightsTracker([m.module for m in pipe.modules], **kw)
    return tensor.ShardTracker(**kw) if pipe.tp > 1 else MemoryTracker(**kw)


def _step_loss(losses: list[Any], pipe: Any, device: torch.device) -> float:
    """The step's loss on a last-stage rank: the mean over micro-batches, and over the replicas
    (their last-stage ranks form one dp group)."""
    loss = float(torch.stack([torch.as_tensor(v).detach().double() for v in losses]).mean())
    if pipe.dp > 1:
        both = torch.tensor([loss], dtype=torch.float64, device=device)
        dist.all_reduce(both, op=dist.ReduceOp.SUM, group=pipe.dp_group)
        loss = float(both[0].item()) / pipe.dp
    return loss


def _timed_step(pipe: Any, rec: Any, opt: Any, params: list[Any], x: Any, y: Any, tk: MemoryTracker | None,
                device: torch.device, rss: bool, meter: CpuAllocatorMeter | None = None,
                ) -> tuple[float, float, int, float, list[Any], RssWindow | None]:
    """One step from leaving the barrier to the end of the optimizer step: the schedule, the
    gradient sync (tied weights, then the replicas; timed on its own), the optimizer.
    (t0, t1, gradient bytes at the step's end, sync ms, the micro-batches' losses, the RSS window
    when `rss`). `meter`: the CPU allocator's peak is taken over this step."""
    losses: list[Any] = []
    args = (tuple(x) if isinstance(x, (tuple, list)) else (x,)) if pipe.is_first else ()
    dist.barrier()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    window = RssWindow().begin() if rss else None
    rec.clear()
    t0 = time.perf_counter()
    with meter.window() if meter is not None else contextlib.nullcontext():
        with tk if tk is not None else contextlib.nullcontext():
            pipe.schedule.step(*args, target=y if pipe.is_last else None, losses=losses, return_outputs=False)
        sync_ms = pipe.sync_gradients()
        grad_bytes = sum(tensor_bytes(zero.local(p.grad)) for p in params if p.grad is not None)
        rec.record(pipe.modules[0].stage, "O", -1, opt.step)
        opt.zero_grad(set_to_none=True)
    t1 = time.perf_counter()
    if window is not None:
        window.end()
    return t0, t1, grad_bytes, sync_ms, losses, window


def _instrument(pipe: Any, device: torch.device) -> Any:
    """The action recorder over this rank's stages and loss, and torch's first-step metadata
    inference made neutral to random generators and buffers (_rng_neutral)."""
    rec = recorder()
    if device.type == "cuda":
        rec.sync = lambda: torch.cuda.synchronize(device)
    for st in pipe.stages:
        rec.wrap_stage(st)
        _rng_neutral(st, device)
    rec.wrap_loss(pipe.schedule)
    return rec
