"""Which (micro-batch size, M, schedule, chunks) points a data x pipeline x tensor layout can run at
all, and the checks of the arguments a search starts from (the cluster, a forced layout and ZeRO
stage) and of what it is held to (--schedule, --microbatches, the batch split), each refusing in
one line with what would run (planner.partition.parallel_search calls them)."""

from __future__ import annotations

import numbers
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable, Sequence

from planner.errors import PplanError, ScheduleError
from planner.hardware import MAX_GPUS_PER_NODE, Hardware
from planner.limits import check_global_batch
from planner.parallel import ParallelConfig, parse_parallel
from planner.partition.search import divisors
from planner.profiling.profile import Profile
from planner.schedules import check_sizes, get_schedule

if TYPE_CHECKING:
    from planner.partition.parallel_eval import ParallelCandidate

__all__ = ["MAX_GPUS", "MAX_MICROBATCHES", "RECOMPUTE_CHOICES", "checked_layout", "distinct_schedules", "runnable_schedules", "check_microbatches", "held_flags",
           "held_size", "check_batch_splits", "check_held_runs", "check_runs", "extrapolated_warning", "hardware_mismatch"]

MAX_MICROBATCHES = 4096
"""Most micro-batches per replica the search plans (given or derived from a micro-batch size)."""
MAX_GPUS = 1 << 20
"""Most GPUs one search takes: the largest degree a ParallelConfig holds (planner.parallel), as
dp alone may span every GPU; checked before the layouts are enumerated (their divisors)."""
RECOMPUTE_CHOICES = ("none", "full", "auto")
"""What the search recomputes: nothing, every layer, or both tried."""


def checked_layout(nodes: int, gpn: int, global_batch: int, recompute: str, compute_scale: float,
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
    check_global_batch(global_batch)
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


def distinct_schedules(names: tuple[str, ...], pp: int) -> tuple[str, ...]:
    """The schedules worth solving on `pp` ranks. On one rank every one-chunk schedule runs the same
    single stage in the same time (no bubble, no sends), so only one is kept: the one holding the
    fewest activations (not every micro-batch's, backward not split), the earlier name on a tie."""
    if pp > 1:
        return names
    single = [n for n in names if not get_schedule(n).multi_chunk]
    if not single:
        return names
    best = min(single, key=lambda n: (get_schedule(n).holds_every_microbatch, get_schedule(n).split_backward, names.index(n)))
    return tuple(n for n in names if n == best or get_schedule(n).multi_chunk)


def runnable_schedules(names: tuple[str, ...], pp: int, m: int, n_layers: int,
                       why: list[str] | None = None) -> list[tuple[str, int]]:
    """The (schedule, chunks per rank) of `names` (distinct_schedules) that run on `pp` ranks with `m`
    micro-batches, every stage holding at least one of the `n_layers` layers; one line per
    (schedule, chunks) that does not is appended to `why` (the search's error explains with it)."""
    out = []
    for name in distinct_schedules(names, pp):
        for v in get_schedule(name).chunk_counts:
            if pp * v > n_layers:
                reason = f"{name} with pp={pp} x {v} stages per rank needs {pp * v} layers, the model has {n_layers}"
            elif pp == 1 and v > 1:
                reason = f"{name} needs at least 2 pipeline ranks, got pp=1"
            else:
                try:
                    check_sizes(name, pp, m, v)
                    out.append((name, v))
                    continue
                except ScheduleError as e:
                    reason = e.message
            if why is not None:
                why.append(reason)
    return out


def check_microbatches(microbatches: int | None) -> None:
    """Refuse a held micro-batch count the search would not plan (None: not held)."""
    if microbatches is None:
        return
    if isinstance(microbatches, bool) or not isinstance(microbatches, numbers.Integral) or not 1 <= microbatches <= MAX_MICROBATCHES:
        raise PplanError(f"--microbatches must be a whole number from 1 to {MAX_MICROBATCHES} per replica, got {microbatches!r}",
                         "e.g. --microbatches 32, or --microbatches auto")


def held_flags(schedule_flag: str, microbatches: int | None) -> str:
    """What a search is held to, as the flags that hold it ('--schedule 1f1b --microbatches 32'; '' for nothing)."""
    return " ".join(f for f in (schedule_flag, f"--microbatches {microbatches}" if microbatches else "") if f)


def held_size(cfg: ParallelConfig, global_batch: int, microbatches: int, allowed: Sequence[int] | None) -> list[int]:
    """[b] when `cfg`'s replicas split the batch into `microbatches` micro-batches of b samples
    (b one of `allowed` when given), else []."""
    b, left = divmod(global_batch, cfg.dp * microbatches)
    return [b] if b >= 1 and not left and (not allowed or b in allowed) else []


def check_batch_splits(layouts: list[ParallelConfig], global_batch: int, n: int, forced: ParallelConfig | None) -> None:
    """PplanError when no layout's dp divides the global batch (so that, rather than memory, is why
    nothing runs: 64 samples over 10^6 GPUs)."""
    least_dp = min(c.dp for c in layouts)
    if all(global_batch % c.dp for c in layouts):
        where = f"--parallel {forced.describe()}" if forced else f"any layout of {n} GPUs"
        raise PplanError(f"--global-batch {global_batch} does not split over the data-parallel replicas of {where} "
                         f"(dp x micro-batch size must divide it; the least dp is {least_dp})",
                         f"give a --global-batch that is a multiple of {least_dp}, or fewer GPUs")


def check_held_runs(layouts: list[ParallelConfig], sizes_of: Callable[[ParallelConfig], list[int]], names: tuple[str, ...],
                    global_batch: int, n_layers: int, schedule_flag: str, microbatches: int | None, where: str) -> None:
    """ScheduleError when the schedules `names` (given as `schedule_flag`; '' when all) and the
    held micro-batch count leave no layout anything to run, memory aside: the first layout's
    reason, and the micro-batch counts nearest the asked one that would run with those schedules."""
    why: list[str] = []
    for cfg in layouts:
        sizes = sizes_of(cfg)
        if not sizes:
            why.append(f"{cfg.describe()}: {global_batch} samples over {cfg.dp} replicas do not split into "
                       + (f"{microbatches} micro-batches" if microbatches else "micro-batches of the sizes searched"))
        for b in sizes:
            m, reasons = global_batch // (cfg.dp * b), []
            if m <= MAX_MICROBATCHES and runnable_schedules(names, cfg.pp, m, n_layers, reasons):
                return
            why.append(f"{cfg.describe()}: {reasons[0] if reasons else f'M={m} is over {MAX_MICROBATCHES}'}")
    def counts(cfg: ParallelConfig) -> list[int]:  # the M that split the batch over cfg's replicas and run the schedules
        return [m for m in (divisors(global_batch // cfg.dp) if global_batch % cfg.dp == 0 else ())
                if m <= MAX_MICROBATCHES and runnable_schedules(names, cfg.pp, m, n_layers)]
    runs = {m for cfg in layouts for m in counts(cfg)}
    nearest = sorted(sorted(runs, key=lambda m: (abs(m - (microbatches or 1)), m))[:5])
    if nearest:
        hint = f"--microbatches {', '.join(map(str, nearest))} would run" + (f" with {schedule_flag}" if schedule_flag else "")
    elif not where.startswith("--parallel"):
        hint = f"{schedule_flag} runs nowhere on these GPUs: choose another --schedule" if schedule_flag else "use --microbatches auto"
    else:  # a forced layout: does another of as many GPUs (tp=1: every node allows it) run them, at the held M if any?
        n = layouts[0].gpus
        alt = next((c for p in divisors(n) if p <= n_layers for c in [replace(layouts[0], dp=n // p, pp=p, tp=1)]
                    if (microbatches in counts(c) if microbatches else counts(c))), None)
        hint = (f"{held_flags(schedule_flag, microbatches)} runs nowhere on {layouts[0].describe()}: choose another --schedule"
                + (f", or --parallel auto ({alt.describe()} runs it)" if alt else ""))
    raise ScheduleError(f"{held_flags(schedule_flag, microbatches)} cannot run on {where}, memory aside (e.g. {why[0]})", hint)


def extrapolated_warning(profile: Profile, best: ParallelCandidate, microbatches: int | None) -> tuple[str, ...]:
    """A warning when a held micro-batch count made the plan's micro-batch larger than any the profile measured."""
    largest = max(profile.micro_batch_sizes)
    if microbatches is None or best.micro_batch_size <= largest:
        return ()
    return (f"--microbatches {microbatches} gives micro-batches of {best.micro_batch_size} samples, beyond the profile's "
            f"largest ({largest}): its times and bytes scale in proportion from {largest}; add "
            f"{best.micro_batch_size} to the profile's sizes (pplan profile -b) to price it as profiled",)


def hardware_mismatch(profile: Profile, hw: Hardware) -> tuple[str, ...]:
    """A warning when the profile's times were computed for other hardware than the plan's peak
    and memory (an analytic profile's `# hardware:` line): planning goes on, mixing the two."""
    made_for = profile.meta.get("hardware")
    if not made_for or made_for == hw.name:
        return ()
    return (f"the profile's times are for hardware {made_for!r} (its '# hardware:' line) but the plan uses the peak and "
            f"memory of {hw.name!r}; for {hw.name} times, make the profile again with --hardware {hw.name}",)


def check_runs(layouts: list[ParallelConfig], sizes_of: Callable[[ParallelConfig], list[int]], names: tuple[str, ...],
               a: dict[str, Any], schedule_flag: str, held_to: str, skipped_for_memory: bool) -> None:
    """PplanError (ScheduleError) when no layout of the search `a` (planner.partition.parallel_search's
    checked arguments) has a point to run, memory aside: no dp splits the batch, or the held
    schedules and micro-batch count run nowhere."""
    forced = None if a["parallel"] == "auto" else a["parallel"]
    n, n_layers = a["nodes"] * a["gpus_per_node"], a["profile"].n_layers
    if held_to or not skipped_for_memory:  # nothing runnable, and not (only) for memory
        check_batch_splits(layouts, a["global_batch"], n, forced)
    if held_to:
        where = f"--parallel {forced.describe()}" if forced else f"any dp x pp x tp layout of {n} GPUs"
        check_held_runs(layouts, sizes_of, names, a["global_batch"], n_layers, schedule_flag, a["microbatches"], where)
