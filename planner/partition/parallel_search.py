"""The cluster question: data x pipeline x tensor parallelism, `plan_parallel(...) -> ParallelResult`.

For N = nodes x gpus_per_node GPUs and a global batch B, every layout D x P x T = N (T in
{1, 2, 4, 8} dividing the GPUs per node, P at most the layers), micro-batch size b (the
profile's sizes and powers of two, D*b dividing B; M = B / (D*b) micro-batches per replica),
schedule (the registry's) and recompute (none / full) is a candidate. `schedules` and `microbatches`
hold the search to some schedules and to M micro-batches per replica (b = B / (D*M) then, any size),
as `pplan partition --schedule/--microbatches` hold the one-pipeline search:

1. prune: a lower bound of the busiest GPU's static memory alone (16 bytes per parameter with
   ZeRO's shares, of one GPU's layer costs: blocks / T, embedding and head whole; at least the
   heaviest layer and an even 1/P share) above the limit -> skipped, and remembered for the
   InfeasibleError; layouts `pplan run` cannot execute for the profile's model are left out
   (planner.partition.parallel_runnable: ZeRO-2/3 with tp; tp on a model other than the built-in
   gpt, or not dividing its heads and FFN width);
2. estimate: balanced stages, iteration ~ (M + bubble(P, schedule)) x per-micro-batch time / P
   + the gradient sync (all of it after the step, as `pplan run` does, unless overlap_grad_sync); candidates are solved in that order (on one
   rank, one of the one-chunk schedules that run alike: parallel_eval.distinct_schedules);
3. solve: the exact pipeline DP (planner.partition.dp) on one GPU's layer costs, i.e. the
   profile's costs transformed by planner.cost.parallel (compute / T + TP all-reduces, memory
   with ZeRO and T division, at the schedule's memory moments as the simulator prices them:
   parallel_eval.memory_moments), until the next estimate is past the top_k-th solution's by the margin,
   skipping on the way each point whose layers no cut balances well enough to come within it
   (planner.partition.branch_bound);
4. judge: every solution within the margin of the top_k-th estimate is simulated
   (planner.simulation), with each stage's exposed gradient sync added before its optimizer
   step; the fastest that fits wins.

Reported: iteration time, samples/s, tokens/s, per-GPU peak memory, achieved TFLOP/s per GPU
(model FLOPs as Narayanan et al. 2021 for a gpt profile, or from the profile's flops column,
over iteration time x N) and MFU (forward + backward FLOPs only, over N x the hardware's peak in
the profile's dtype). The model trains in that dtype (planner.cost.parallel.training_precision):
a 16-bit profile in mixed precision, a float32 one in pure fp32, 16 bytes per parameter either way.
When no plan fits, the refusal and its fixes, each searched again: planner.partition.parallel_hints.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import numpy as np

from planner.cost.parallel import checked_mfu, exposed_sync_ms, grad_sync_ms, model_flops
from planner.cost.replica_bytes import gradient_bytes
from planner.errors import PplanError
from planner.hardware import Hardware, load_hardware
from planner.parallel import GRAD_SYNC_AFTER_STEP, GRAD_SYNC_OVERLAPPED, ParallelConfig
from planner.partition.parallel_checks import (MAX_GPUS, MAX_MICROBATCHES, RECOMPUTE_CHOICES, check_microbatches, check_runs,
                                               checked_layout, extrapolated_warning, hardware_mismatch,
                                               held_flags, held_size, runnable_schedules)
from planner.partition.branch_bound import ESTIMATE_MARGIN, solve_best
from planner.partition.parallel_eval import (ParallelCandidate, ParallelCosts, ParallelTask, helping_zero, least_memory,
                                             least_static_bytes, simulate_task)
from planner.partition.parallel_hints import Shortfall, infeasible_error, searched_micro_batch_sizes
from planner.partition.parallel_runnable import layout_error, layout_refusal, runnable_alternatives
from planner.partition.search import divisors
from planner.profiling.profile import Profile
from planner.schedules import SCHEDULE_NAMES, get_schedule
from planner.units import format_bytes

__all__ = ["ParallelCandidate", "ParallelResult", "plan_parallel", "candidate_layouts", "TP_DEGREES", "RECOMPUTE_CHOICES",
           "MAX_GPUS"]

TP_DEGREES = (1, 2, 4, 8)
ANALYTIC_SIZES = (1, 2, 4, 8)


@dataclass(frozen=True)
class ParallelResult:
    """The chosen layout, the runners-up and what the search did."""

    best: ParallelCandidate
    """Fastest plan that fits."""
    candidates: tuple[ParallelCandidate, ...]
    """Every simulated plan, best first."""
    gpus: int
    """N = nodes x gpus_per_node."""
    gpus_per_node: int
    """GPUs per node."""
    hardware: str
    """Hardware name."""
    global_batch: int
    """Samples per iteration (B)."""
    seq: int
    """Tokens per sample (1 when the profile does not say)."""
    flops_source: str
    """How model FLOPs were counted."""
    dtype: str
    """The profile's dtype, which the model trains in (bytes per parameter; MFU's peak)."""
    mfu_peak_flops_per_s: float
    """The peak MFU divides by: the hardware's, in that dtype."""
    layouts: int
    """(D, P, T) layouts considered."""
    solved: int
    """Points of the search priced: each by the pipeline DP, unless planner.partition.memory_floor
    proved first that it fits no cut (JSON `pipeline_dps`, its name before that proof existed)."""
    skipped: tuple[str, ...]
    """Layouts left out, with the reason."""
    warnings: tuple[str, ...] = ()
    """One line each: inputs that disagree without being wrong (a profile made for other hardware)."""
    vocab_parallel: bool = False
    """Priced with Megatron's vocabulary split over tp (plan_parallel), not as `pplan run` executes it."""
    held_to: str = ""
    """The schedules and micro-batch count the search was held to, as flags ('--schedule 1f1b
    --microbatches 32'); '' when it searched them all."""
    grad_sync: str = GRAD_SYNC_AFTER_STEP
    """What the prices assumed of the gradient sync (planner.parallel.GRAD_SYNC_MODES)."""
    memory_bytes: float = 0.0
    """Memory per GPU the plans were held to, bytes (--memory, else the hardware's)."""



def _layouts(n: int, gpn: int, n_layers: int, forced: ParallelConfig | None, zero: int, model: str | None,
             runnable_only: bool, global_batch: int) -> tuple[list[ParallelConfig], list[str]]:
    """The layouts to search with ZeRO stage `zero`, and a line per one left out. `runnable_only`:
    leave out (a forced one: refuse) what `pplan run` cannot execute for model spec `model`
    (planner.partition.parallel_runnable: ZeRO-2/3 with tp, tp on a model it does not split); a
    refused forced layout's hint names only alternatives whose dp splits `global_batch`."""
    if forced is not None:
        if forced.gpus != n:
            raise PplanError(f"--parallel {forced.describe()} uses {forced.gpus} GPUs but the cluster has {n}",
                             "make dp x pp x tp equal nodes x gpus per node, or use --parallel auto")
        if gpn % forced.tp:
            raise PplanError(f"tp={forced.tp} does not divide {gpn} GPUs per node", "tensor parallelism stays within a node")
        if forced.pp > n_layers:
            raise PplanError(f"pp={forced.pp} but the profile has {n_layers} layers", f"use pp={n_layers} or fewer")
        error = layout_error(forced, model) if runnable_only else None
        if error is not None:
            alternatives = runnable_alternatives(forced, model, gpn, global_batch)
            if not alternatives:
                raise PplanError(f"--parallel {forced.describe()}: {error.message}",
                                 f"no layout of {forced.gpus} GPUs with pp={forced.pp} that pplan run executes "
                                 f"splits --global-batch {global_batch}; change --global-batch or --nodes")
            runs = " or ".join(c.describe() for c in alternatives)
            raise PplanError(f"--parallel {forced.describe()}: {error.message}", f"pplan run executes e.g. --parallel {runs}")
        return [forced], []
    layouts, skipped = [], []
    for cfg in candidate_layouts(n, gpn, n_layers):
        cfg = replace(cfg, zero=zero)
        why = layout_refusal(cfg, model) if runnable_only else None
        if why:
            skipped.append(f"{cfg.describe()}: {why}")
        else:
            layouts.append(cfg)
    return layouts, skipped


def candidate_layouts(n: int, gpn: int, n_layers: int) -> list[ParallelConfig]:
    """Every dp x pp x tp = n with tp in TP_DEGREES dividing the GPUs per node and pp <= layers."""
    out = []
    for t in TP_DEGREES:
        if gpn % t or n % t:
            continue
        for p in divisors(n // t):
            if p > n_layers:
                break
            out.append(ParallelConfig(dp=n // (t * p), pp=p, tp=t))
    return out


def plan_parallel(
    profile: Profile | None = None,
    *,
    model: str | None = None,
    hardware: Hardware | str,
    nodes: int,
    gpus_per_node: int | None = None,
    global_batch: int,
    parallel: ParallelConfig | str | None = "auto",
    zero: int | None = None,
    recompute: str = "auto",
    schedules: Sequence[str] | None = None,
    micro_batch_sizes: Sequence[int] | None = None,
    microbatches: int | None = None,
    memory_bytes: int | None = None,
    top_k: int = 4,
    compute_scale: float = 1.0,
    overlap_grad_sync: bool = False,
    vocab_parallel: bool = False,
    check_hints: bool = True,
    on_step: Callable[[int, int, str], None] | None = None,
) -> ParallelResult:
    """The fastest (D, P, T) x b x schedule x recompute plan of `profile` (or an analytic profile of
    the gpt spec `model`) on `nodes` x `gpus_per_node` GPUs of `hardware` (module docstring).

    `parallel`: "auto" / None to search, or a ParallelConfig / "dp=D,pp=P,tp=T" to force the layout.
    `zero`: the ZeRO stage (None: the forced layout's, else 0); a layout that says another is
    refused. `recompute`: none, full or auto (both). `schedules`: the registry's names to try (None: all). `microbatches`: M per
    replica (None: every M the micro-batch sizes give); each layout then runs b = B / (D*M), which
    must also be one of `micro_batch_sizes` when those are given. ScheduleError when these two leave
    no layout anything to run, naming the micro-batch counts that would. `compute_scale` multiplies
    every profiled compute time (a calibration; 1 = as profiled). `overlap_grad_sync`: the gradient
    sync overlaps each stage's last backward (True, as DDP and DeepSpeed's ZeRO do) or runs entirely
    after it (False: as `pplan run` executes it, and Megatron-LM 2021 did).
    `vocab_parallel`: price tensor parallelism as Megatron runs it, the embedding and head split
    over tp too (for comparing with Megatron's published runs: planner.bench.published); False
    prices what `pplan run` executes, those layers whole on every tp rank, and leaves out the
    layouts it cannot execute for the profile's model (planner.partition.parallel_runnable: a
    forced one is refused, naming layouts that run).
    InfeasibleError when nothing fits, naming the GPUs or memory that would; PplanError when the
    profile's times beat the hardware's peak (an MFU above 100%: planner.cost.parallel.checked_mfu).
    A profile made for other hardware plans on, with a line in the result's `warnings`. `check_hints`:
    the InfeasibleError names only fixes confirmed by searching again with each (False: no search).
    `on_step(done, total, note)`: progress over the points the search prices, total the points it may
    solve (the bound settles the rest at once: done jumps to total).
    """
    args = _request(dict(profile=profile, model=model, hardware=hardware, nodes=nodes, gpus_per_node=gpus_per_node,
                         global_batch=global_batch, parallel=parallel, zero=zero, recompute=recompute, schedules=schedules,
                         micro_batch_sizes=micro_batch_sizes, microbatches=microbatches, memory_bytes=memory_bytes,
                         top_k=top_k, compute_scale=compute_scale, overlap_grad_sync=overlap_grad_sync,
                         vocab_parallel=vocab_parallel))
    got = _search(args, on_step)
    if isinstance(got, Shortfall):
        def attempt(change: dict[str, Any]) -> ParallelResult | Shortfall:  # one fix, searched for its best plan only
            return _search(_request({**args, **change, "top_k": 1}))
        raise infeasible_error(got, args, attempt if check_hints else None, lambda: _least_memory(args))
    return got


def _request(raw: dict[str, Any]) -> dict[str, Any]:
    """plan_parallel's arguments checked and resolved (hardware a Hardware, the GPUs per node, the
    forced layout or "auto", the ZeRO stage, the profile, the memory per GPU), so that a fix is
    the same arguments with a change and passes the same checks."""
    hw = raw["hardware"] if isinstance(raw["hardware"], Hardware) else load_hardware(raw["hardware"])
    gpn = raw["gpus_per_node"] if raw["gpus_per_node"] is not None else hw.gpus_per_node  # 0 is refused, not the preset's
    forced, zero = checked_layout(raw["nodes"], gpn, raw["global_batch"], raw["recompute"], raw["compute_scale"],
                                  raw["parallel"], raw["zero"])
    check_microbatches(raw["microbatches"])
    profile = raw["profile"] if raw["profile"] is not None else _analytic(raw["model"], hw, raw["micro_batch_sizes"])
    mem = raw["memory_bytes"] if raw["memory_bytes"] is not None else hw.memory_bytes
    # numpy integers too, as plain ints for ParallelConfig
    return {**raw, "profile": profile, "model": None, "hardware": hw, "nodes": int(raw["nodes"]), "gpus_per_node": int(gpn),
            "parallel": forced or "auto", "zero": zero, "memory_bytes": float(mem)}


def _search(a: dict[str, Any], on_step: Callable[[int, int, str], None] | None = None) -> ParallelResult | Shortfall:
    """One search of checked arguments `a` (_request): the fastest plan that fits, or, when none
    does, what the search learnt of the memory one needs. Raises PplanError (ScheduleError) when
    nothing could run whatever the memory."""
    profile, hw, gpn, mem = a["profile"], a["hardware"], a["gpus_per_node"], a["memory_bytes"]
    warnings, n, flops = hardware_mismatch(profile, hw), a["nodes"] * gpn, model_flops(profile, a["global_batch"])
    ctx, layouts, skipped, names, recs = _space(a)
    schedule_flag = f"--schedule {','.join(names)}" if a["schedules"] else ""
    held_to = held_flags(schedule_flag, a["microbatches"])
    sizes_of = _sizes_of(a, profile)
    tasks, need_min = _tasks(ctx, layouts, sizes_of, names, recs, a["global_batch"], mem, skipped)
    if not tasks:  # may anything run at all, memory aside?
        check_runs(layouts, sizes_of, names, a, schedule_flag, held_to, math.isfinite(need_min))
    keep = max(1, a["top_k"])
    found, solved, min_scale = solve_best(ctx, tasks, mem, gpn, keep, on_step)
    if not found:
        return Shortfall(need_min, min_scale, False, helping_zero(ctx, layouts, mem), held_to)
    sims = _judge(ctx, found, keep, mem, flops)
    checked_mfu(max(c.mfu for c in sims), hw.peak_flops_per_s(flops.dtype), hw.name)
    if not sims[0].fits:  # the DP's plans fit its bound, their simulations do not
        return Shortfall(need_min, min(c.peak_memory_bytes for c in sims), True, helping_zero(ctx, layouts, mem), held_to)
    return ParallelResult(best=sims[0], candidates=tuple(sims), gpus=n, gpus_per_node=gpn, hardware=hw.name,
                          global_batch=a["global_batch"], seq=flops.tokens_per_sample, flops_source=flops.source,
                          dtype=flops.dtype, mfu_peak_flops_per_s=hw.peak_flops_per_s(flops.dtype), layouts=len(layouts),
                          solved=solved, skipped=tuple(skipped),
                          warnings=warnings + extrapolated_warning(profile, sims[0], a["microbatches"])
                          + ((flops.warning,) if flops.warning else ()),
                          vocab_parallel=a["vocab_parallel"], held_to=held_to,
                          grad_sync=GRAD_SYNC_OVERLAPPED if a["overlap_grad_sync"] else GRAD_SYNC_AFTER_STEP, memory_bytes=mem)


def _space(a: dict[str, Any]) -> tuple[ParallelCosts, list[ParallelConfig], list[str], tuple[str, ...], tuple[str, ...]]:
    """What a search of `a` (_request's arguments) ranges over: (its shared costs, the layouts, a line
    per layout left out, the schedule names, the recompute choices)."""
    profile, gpn = a["profile"], a["gpus_per_node"]
    names = tuple(dict.fromkeys(a["schedules"] or SCHEDULE_NAMES))  # a name given twice is solved once
    for name in names:
        get_schedule(name)
    ctx = ParallelCosts(profile, a["hardware"], gpn, a["zero"], float(a["compute_scale"]), a["overlap_grad_sync"], a["vocab_parallel"])
    forced = None if a["parallel"] == "auto" else a["parallel"]
    layouts, skipped = _layouts(a["nodes"] * gpn, gpn, profile.n_layers, forced, a["zero"], profile.meta.get("model"),
                                runnable_only=not a["vocab_parallel"], global_batch=a["global_batch"])
    recs = ("none", "full") if a["recompute"] == "auto" else (a["recompute"],)
    return ctx, layouts, skipped, names, recs


def _least_memory(a: dict[str, Any]) -> float:
    """The least memory per GPU under which the pipeline DP fits some point of the search `a`
    (_request's arguments; inf when none ever does): the least size a search of `a` finds a plan at,
    since a point the DP fits simulates within what the DP charged (planner.partition.parallel_eval.
    least_memory). Points are priced in the order of their layout's static bytes, a lower bound of
    their need, until that bound reaches the least found."""
    ctx, layouts, _, names, recs = _space(a)
    tasks, _ = _tasks(ctx, layouts, _sizes_of(a, a["profile"]), names, recs, a["global_batch"], math.inf, [])
    static = {cfg: least_static_bytes(ctx, cfg) for cfg in layouts}
    least = math.inf
    for task in sorted(tasks, key=lambda t: static[t.cfg]):
        if static[task.cfg] >= least:
            break
        least = min(least, least_memory(ctx, task))
    return least


def _sizes_of(a: dict[str, Any], profile: Profile) -> Callable[[ParallelConfig], list[int]]:
    """The micro-batch sizes a layout is searched at: the given ones, else the profile's and powers of
    two up to 8; with a held micro-batch count, the one size that splits the batch into it."""
    given = a["micro_batch_sizes"]
    sizes = searched_micro_batch_sizes(given, profile.micro_batch_sizes)
    if a["microbatches"] is None:
        return lambda cfg: sizes
    return lambda cfg: held_size(cfg, a["global_batch"], a["microbatches"], given)


def _analytic(model: str | None, hw: Hardware, micro_batch_sizes: Sequence[int] | None) -> Profile:
    """The analytic profile of a gpt spec on `hw` (planning without a measured profile)."""
    if model is None:
        raise PplanError("give a profile or a gpt model spec", "e.g. model='gpt:layers=96,hidden=12288,heads=96,seq=2048,vocab=51200'")
    from planner.profiling.analytic import analytic_profile
    return analytic_profile(model, hw, "bfloat16", list(micro_batch_sizes or ANALYTIC_SIZES))


def _judge(ctx: ParallelCosts, found: list[Any], keep: int, mem: float, flops: Any) -> list[ParallelCandidate]:
    """Simulate the `keep` best estimates and every other one within ESTIMATE_MARGIN of the
    keep-th (the estimate and the simulation order close plans differently: one may win once
    simulated); fastest fitting first."""
    found.sort(key=lambda x: x[0])
    bound = found[min(keep, len(found)) - 1][0] * (1.0 + ESTIMATE_MARGIN)
    judged = found[:keep] + [f for f in found[keep:] if f[0] <= bound]
    sims = [simulate_task(ctx, task, sol, mem, flops) for _, task, sol in judged]
    sims.sort(key=lambda c: (not c.fits, c.iteration_ms, c.config.tp, c.config.pp, c.micro_batch_size))
    return sims


def _tasks(ctx: ParallelCosts, layouts: list[ParallelConfig], sizes_of: Callable[[ParallelConfig], list[int]], names: tuple[str, ...],
           recs: tuple[str, ...], global_batch: int, mem: float, skipped: list[str]) -> tuple[list[ParallelTask], float]:
    """Every runnable (layout, b, schedule, recompute) with its balanced estimate, cheapest first, and
    the least per-GPU static bytes of the layouts skipped for memory (appended to `skipped`)."""
    L = ctx.profile.n_layers
    tasks: list[ParallelTask] = []
    need_min = math.inf  # least per-GPU static bytes over layouts that were skipped for memory
    for cfg in layouts:
        static = least_static_bytes(ctx, cfg)
        if static > mem:
            need_min = min(need_min, static)
            skipped.append(f"{cfg.describe()}: weights, gradients and optimizer state alone need {format_bytes(static)} per GPU")
            continue
        for b in sizes_of(cfg):
            if global_batch % (cfg.dp * b):
                continue
            m = global_batch // (cfg.dp * b)
            if m > MAX_MICROBATCHES:
                continue
            costs = ctx.costs(cfg, b)
            refwd = float(np.sum(costs.fwd_ms))
            place = ctx.place(cfg)
            # one GPU's share of the gradients (blocks / T, layers kept whole on every tp rank)
            sync = grad_sync_ms(float(np.sum(gradient_bytes(costs.param_bytes, ctx.precision))) / cfg.pp, cfg.dp, ctx.zero, place.dp)
            opt = float(np.sum(costs.optimizer_ms)) / cfg.pp
            for name, v in runnable_schedules(names, cfg.pp, m, L):
                for rec in recs:
                    # per rank and micro-batch: forward + backward, and the backward the sync hides behind
                    # (planner.cost.parallel.rank_exposed_sync_ms), both with the recomputed forward
                    bwd = (float(np.sum(costs.bwd_ms)) + (refwd if rec == "full" else 0.0)) / cfg.pp
                    t_mb = refwd / cfg.pp + bwd
                    est = (m + get_schedule(name).bubble_slots(cfg.pp, v)) * t_mb + exposed_sync_ms(sync, bwd, ctx.overlap) + opt
                    tasks.append(ParallelTask(cfg, b, m, name, v, rec, est))
    tasks.sort(key=lambda t: (t.estimate_ms, t.cfg.tp, t.cfg.pp, t.b, SCHEDULE_NAMES.index(t.schedule), t.v, t.recompute))

    return tasks, need_min
