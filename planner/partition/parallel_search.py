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
   InfeasibleError; layouts `pplan run` cannot execute are left out (planner.parallel.run_refusal);
2. estimate: balanced stages, iteration ~ (M + bubble(P, schedule)) x per-micro-batch time / P
   + the gradient sync (all of it after the step, as `pplan run` does, unless overlap_grad_sync); candidates are solved in that order (on one
   rank, one of the one-chunk schedules that run alike: parallel_eval.distinct_schedules);
3. solve: the exact pipeline DP (planner.partition.dp) on one GPU's layer costs, i.e. the
   profile's costs transformed by planner.cost.parallel (compute / T + TP all-reduces, memory
   with ZeRO and T division), until the next estimate is past the top_k-th solution's by the margin;
4. judge: every solution within the margin of the top_k-th estimate is simulated
   (planner.simulation), with each stage's exposed gradient sync added before its optimizer
   step; the fastest that fits wins.

Reported: iteration time, samples/s, tokens/s, per-GPU peak memory, achieved TFLOP/s per GPU
(model FLOPs as Narayanan et al. 2021 for a gpt profile, or from the profile's flops column,
over iteration time x N) and MFU (forward + backward FLOPs only, over N x the hardware's peak in
the profile's dtype). The model trains in that dtype (planner.cost.parallel.training_precision):
a 16-bit profile in mixed precision, a float32 one in pure fp32, 16 bytes per parameter either way.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import numpy as np

from planner.cost.parallel import checked_mfu, exposed_sync_ms, grad_sync_ms, model_flops
from planner.cost.replica_bytes import gradient_bytes
from planner.errors import InfeasibleError, PplanError
from planner.hardware import MAX_GPUS_PER_NODE, Hardware, load_hardware
from planner.parallel import GRAD_SYNC_AFTER_STEP, GRAD_SYNC_OVERLAPPED, ParallelConfig, parse_parallel, run_refusal
from planner.partition.parallel_checks import (MAX_MICROBATCHES, check_batch_splits, check_held_runs, check_microbatches,
                                               extrapolated_warning, hardware_mismatch, held_flags, held_size, runnable_schedules)
from planner.partition.parallel_eval import (ParallelCandidate, ParallelCosts, ParallelTask, helping_zero, least_static_bytes,
                                             simulate_task, solve_task)
from planner.partition.search import divisors
from planner.profiling.profile import Profile
from planner.schedules import SCHEDULE_NAMES, get_schedule
from planner.units import format_bytes, format_size_up, parse_bytes

__all__ = ["ParallelCandidate", "ParallelResult", "plan_parallel", "candidate_layouts", "TP_DEGREES", "RECOMPUTE_CHOICES"]

TP_DEGREES = (1, 2, 4, 8)
RECOMPUTE_CHOICES = ("none", "full", "auto")
ANALYTIC_SIZES = (1, 2, 4, 8)
_MAX_SOLVES = 400  # pipeline DPs at most per search (the bound usually stops far earlier)
# The DP-based estimate and the simulation order close plans differently (sends charged in full,
# zb's closed-form bubble): measured -4.1% .. +3.5% of the simulation over the plans within 15% of
# the best (docs/parallel.md, the 7.5B example), so every solution within this margin of the
# top_k-th best estimate is simulated too, rather than trusting an ordering it cannot resolve.
_ESTIMATE_MARGIN = 0.05
MAX_GPUS = 1 << 20
"""Most GPUs one search takes: the largest degree a ParallelConfig holds (planner.parallel), as
dp alone may span every GPU; checked before the layouts are enumerated (their divisors)."""


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
    """Pipeline DPs run."""
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


def _layouts(n: int, gpn: int, n_layers: int, forced: ParallelConfig | None, zero: int,
             runnable_only: bool) -> tuple[list[ParallelConfig], list[str]]:
    """The layouts to search with ZeRO stage `zero`, and a line per one left out. `runnable_only`:
    leave out (a forced one: refuse) what `pplan run` cannot execute (planner.parallel.run_refusal)."""
    if forced is not None:
        if forced.gpus != n:
            raise PplanError(f"--parallel {forced.describe()} uses {forced.gpus} GPUs but the cluster has {n}",
                             "make dp x pp x tp equal nodes x gpus per node, or use --parallel auto")
        if gpn % forced.tp:
            raise PplanError(f"tp={forced.tp} does not divide {gpn} GPUs per node", "tensor parallelism stays within a node")
        if forced.pp > n_layers:
            raise PplanError(f"pp={forced.pp} but the profile has {n_layers} layers", f"use pp={n_layers} or fewer")
        why = run_refusal(forced) if runnable_only else None
        if why:
            raise PplanError(f"--parallel {forced.describe()}: {why}",
                             f"e.g. --parallel {replace(forced, zero=1).describe()}, or tp=1 with ZeRO {forced.zero}")
        return [forced], []
    layouts, skipped = [], []
    for cfg in candidate_layouts(n, gpn, n_layers):
        cfg = replace(cfg, zero=zero)
        why = run_refusal(cfg) if runnable_only else None
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
    layouts it cannot execute (planner.parallel.run_refusal: a forced one is refused).
    InfeasibleError when nothing fits, naming the GPUs or memory that would; PplanError when the
    profile's times beat the hardware's peak (an MFU above 100%: planner.cost.parallel.checked_mfu).
    A profile made for other hardware plans on, with a line in the result's `warnings`. `check_hints`:
    the InfeasibleError names only fixes confirmed by searching again with each (False: no search).
    """
    hw = hardware if isinstance(hardware, Hardware) else load_hardware(hardware)
    gpn = gpus_per_node if gpus_per_node is not None else hw.gpus_per_node  # 0 is refused, not the preset's
    forced, zero = _checked_layout(nodes, gpn, global_batch, recompute, compute_scale, parallel, zero)
    check_microbatches(microbatches)
    nodes, gpn = int(nodes), int(gpn)  # numpy integers too, as plain ints for ParallelConfig
    if profile is None:
        profile = _analytic(model, hw, micro_batch_sizes)
    warnings = hardware_mismatch(profile, hw)
    n = nodes * gpn
    mem = float(memory_bytes if memory_bytes is not None else hw.memory_bytes)
    flops = model_flops(profile, global_batch)
    names = tuple(dict.fromkeys(schedules or SCHEDULE_NAMES))  # a name given twice is solved once
    for name in names:
        get_schedule(name)
    schedule_flag = f"--schedule {','.join(names)}" if schedules else ""
    held_to = held_flags(schedule_flag, microbatches)
    recs = ("none", "full") if recompute == "auto" else (recompute,)
    sizes = sorted(set(micro_batch_sizes or ()) | set(profile.micro_batch_sizes) | {1, 2, 4, 8}) if not micro_batch_sizes else sorted(set(micro_batch_sizes))
    ctx = ParallelCosts(profile, hw, gpn, zero, float(compute_scale), overlap_grad_sync, vocab_parallel)
    L = profile.n_layers
    layouts, skipped = _layouts(n, gpn, L, forced, zero, runnable_only=not vocab_parallel)

    def sizes_of(cfg: ParallelConfig) -> list[int]:
        return sizes if microbatches is None else held_size(cfg, global_batch, microbatches, micro_batch_sizes)

    tasks, need_min = _tasks(ctx, layouts, sizes_of, names, recs, global_batch, mem, skipped)
    if not tasks and (held_to or not math.isfinite(need_min)):  # nothing runnable, and not for memory
        check_batch_splits(layouts, global_batch, n, forced)
    if not tasks and held_to:  # memory aside, may the schedules and M run at all?
        where = f"--parallel {forced.describe()}" if forced else f"any dp x pp x tp layout of {n} GPUs"
        check_held_runs(layouts, sizes_of, names, global_batch, L, schedule_flag, microbatches, where)
    keep = max(1, top_k)
    args = dict(profile=profile, hardware=hw, nodes=nodes, gpus_per_node=gpn, global_batch=global_batch, parallel=forced or "auto",
                zero=zero, recompute=recompute, schedules=schedules, micro_batch_sizes=micro_batch_sizes, microbatches=microbatches,
                memory_bytes=mem, compute_scale=compute_scale, overlap_grad_sync=overlap_grad_sync, vocab_parallel=vocab_parallel,
                check_hints=check_hints)
    found, solved, min_scale = _solve_best(ctx, tasks, mem, gpn, keep)
    if not found:
        raise _infeasible(args, need_min, min_scale, helping_zero(ctx, layouts, mem), held_to=held_to)
    sims = _judge(ctx, found, keep, mem, flops)
    checked_mfu(max(c.mfu for c in sims), hw.peak_flops_per_s(flops.dtype), hw.name)
    if not sims[0].fits:
        raise _infeasible(args, need_min, sims[0].peak_memory_bytes, helping_zero(ctx, layouts, mem), True, held_to)
    return ParallelResult(best=sims[0], candidates=tuple(sims), gpus=n, gpus_per_node=gpn, hardware=hw.name,
                          global_batch=global_batch, seq=flops.tokens_per_sample, flops_source=flops.source, dtype=flops.dtype,
                          mfu_peak_flops_per_s=hw.peak_flops_per_s(flops.dtype), layouts=len(layouts), solved=solved,
                          skipped=tuple(skipped), warnings=warnings + extrapolated_warning(profile, sims[0], microbatches),
                          vocab_parallel=vocab_parallel, held_to=held_to,
                          grad_sync=GRAD_SYNC_OVERLAPPED if overlap_grad_sync else GRAD_SYNC_AFTER_STEP, memory_bytes=mem)


def _checked_layout(nodes: int, gpn: int, global_batch: int, recompute: str, compute_scale: float,
                    parallel: ParallelConfig | str | None, zero: int | None) -> tuple[ParallelConfig | None, int]:
    """Refuse arguments the search cannot start with; (the forced layout or None, the ZeRO stage)."""
    if not (isinstance(compute_scale, (int, float)) and 0 < compute_scale < 1e3):
        raise PplanError(f"compute scale must be a positive number, got {compute_scale!r}")
    for what, value in (("--nodes", nodes), ("--gpus-per-node", gpn)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise PplanError(f"{what} must be a whole number of at least 1, got {value!r}", "e.g. --nodes 2 --gpus-per-node 8")
    if gpn > MAX_GPUS_PER_NODE:
        raise PplanError(f"--gpus-per-node {gpn} is more than any node holds (at most {MAX_GPUS_PER_NODE})", "e.g. --gpus-per-node 8")
    if nodes * gpn > MAX_GPUS:
        raise PplanError(f"--nodes {nodes} x --gpus-per-node {gpn} = {nodes * gpn} GPUs is more than the planner searches ({MAX_GPUS})",
                         f"use at most {MAX_GPUS // gpn} nodes of {gpn} GPUs")
    if global_batch < 1:
        raise PplanError(f"--global-batch must be at least 1, got {global_batch}")
    if recompute not in RECOMPUTE_CHOICES:
        raise PplanError(f"unknown recompute {recompute!r}", f"use one of {', '.join(RECOMPUTE_CHOICES)}")
    if zero is not None:
        ParallelConfig(zero=zero)  # validates the stage
    forced: ParallelConfig | None = None
    if isinstance(parallel, ParallelConfig):
        forced = parallel
        if zero is not None and zero != forced.zero:
            raise PplanError(f"the layout {forced.describe()} has ZeRO stage {forced.zero} but zero={zero} was given",
                             "give the ZeRO stage once")
    elif parallel not in (None, "auto"):
        forced = parse_parallel(str(parallel), zero)  # the text's zero wins; one that --zero contradicts is refused
    return forced, forced.zero if forced is not None else (zero or 0)


def _analytic(model: str | None, hw: Hardware, micro_batch_sizes: Sequence[int] | None) -> Profile:
    """The analytic profile of a gpt spec on `hw` (planning without a measured profile)."""
    if model is None:
        raise PplanError("give a profile or a gpt model spec", "e.g. model='gpt:layers=96,hidden=12288,heads=96,seq=2048,vocab=51200'")
    from planner.profiling.analytic import analytic_profile
    return analytic_profile(model, hw, "bfloat16", list(micro_batch_sizes or ANALYTIC_SIZES))


def _judge(ctx: ParallelCosts, found: list[Any], keep: int, mem: float, flops: Any) -> list[ParallelCandidate]:
    """Simulate the `keep` best estimates and every other one within _ESTIMATE_MARGIN of the
    keep-th (the estimate and the simulation order close plans differently: one may win once
    simulated); fastest fitting first."""
    found.sort(key=lambda x: x[0])
    bound = found[min(keep, len(found)) - 1][0] * (1.0 + _ESTIMATE_MARGIN)
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


def _solve_best(ctx: ParallelCosts, tasks: list[ParallelTask], mem: float, gpn: int, keep: int) -> tuple[list, int, float]:
    """(the `keep` best DP solutions as (estimate, task, solution), DPs run, least memory scale
    that would fit among the tasks that did not)."""
    # Branch and bound: a task's estimate is a lower bound of its DP-based estimate (the
    # bottleneck stage is at least the balanced share), so solving stops once the next task's
    # estimate exceeds the top_k-th best DP-based estimate found (or after _MAX_SOLVES).
    solved, found = 0, []
    min_scale = math.inf
    for task in tasks:
        if len(found) >= keep and task.estimate_ms > sorted(f[0] for f in found)[keep - 1] * (1.0 + _ESTIMATE_MARGIN):
            break
        if solved >= _MAX_SOLVES and found:
            break
        got = solve_task(ctx, task, mem, gpn)
        solved += 1
        if isinstance(got, float):
            min_scale = min(min_scale, got)
            continue
        found.append(got)
    return found, solved, min_scale


def _infeasible(args: dict[str, Any], need_static: float, need_peak: float, zero_hint: int | None, absolute: bool = False,
                held_to: str = "") -> InfeasibleError:
    """InfeasibleError naming the fixes a search with each confirms, the held flags' first (args: plan_parallel's;
    `need`: the least memory per GPU any candidate needs, a lower bound; inf when none was priced)."""
    n, gpn, mem, forced = args["nodes"] * args["gpus_per_node"], args["gpus_per_node"], args["memory_bytes"], args["parallel"]
    need, auto = need_peak if absolute else min(need_static, need_peak), {"parallel": "auto"} if forced != "auto" else {}
    held = [(f, c) for f, c, on in (("--microbatches auto", {"microbatches": None}, args["microbatches"] is not None),
                                    ("--schedule auto", {"schedules": None}, bool(args["schedules"])),
                                    ("--recompute auto", {"recompute": "auto"}, args["recompute"] == "none"),
                                    ("--parallel auto", auto, bool(auto))) if on]
    flags = " ".join(t for t in (held_to, "--recompute none" if args["recompute"] == "none" else "") if t)
    where = (f"--parallel {forced.describe()}" if auto else "every dp x pp x tp layout") + (f" and {flags}" if flags else "")
    head = f"the least memory-hungry layout needs about {format_size_up(need)} per GPU" if math.isfinite(need) else ""
    error = f"no plan fits {format_bytes(mem)} per GPU ({args['hardware'].name}) with {where} on {n} GPUs"
    if not args["check_hints"]:
        return InfeasibleError(error, head or "more memory per GPU")
    fixes = [_fix(args, f, c) for f, c in held]
    if len(held) > 1 and not any(fixes):  # all of them together
        fixes.append(_fix(args, " ".join(f for f, _ in held), {k: v for _, c in held for k, v in c.items()}))
    more, notes = max(args["nodes"] + 1, math.ceil(n * need / mem / gpn) if math.isfinite(need) else 2 * args["nodes"]), []
    tries = [k for k in (more, 2 * more, 4 * more) if k * gpn <= MAX_GPUS]
    fixes.append(next((f for f in (_fix(args, f"{k * gpn} GPUs ({k} nodes of {gpn}{' with --parallel auto' if auto else ''})",
                                         {"nodes": k, **auto}) for k in tries) if f), ""))
    notes += [f"{', '.join(str(k * gpn) for k in tries)} GPUs do not fit either"] if tries and not fixes[-1] else []
    if math.isfinite(need):  # need is a lower bound: the least of a few multiples that fits
        sizes = [format_size_up(need * x) for x in (1, 1.5, 2, 4)]
        fixes.append(next((f for f in (_fix(args, f"GPUs with at least {x}", {"memory_bytes": parse_bytes(x)}) for x in sizes) if f), ""))
        notes += [] if fixes[-1] else [f"GPUs with {sizes[-1]} do not fit either"]
    if zero_hint is not None:  # a stage under which some layout's static bytes fit (helping_zero)
        sharded = {"parallel": replace(forced, zero=zero_hint)} if auto else {}
        fixes.append(_fix(args, f"--zero {zero_hint}", {"zero": zero_hint, **sharded}))
    fixes, lead = [f for f in fixes if f], " ".join(t for t in (head, f"({'; '.join(notes)})" if notes else "") if t)
    use = "use " + ", ".join(fixes[:-1]) + (", or " if fixes[1:] else "") + fixes[-1] if fixes else "no change tried fits"
    return InfeasibleError(error, (lead + ": " if lead else "") + use)


def _fix(args: dict[str, Any], flag: str, change: dict[str, Any]) -> str:
    """`flag` and the plan it gives when plan_parallel(**args) with `change` finds one that fits, else ''."""
    try:
        best = plan_parallel(**{**args, **change, "check_hints": False, "top_k": 1}).best
    except PplanError:
        return ""
    return f"{flag} ({best.config.describe()} {best.schedule_label}, M={best.n_microbatches}, recompute {best.recompute})"
