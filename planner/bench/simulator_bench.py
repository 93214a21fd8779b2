"""`pplan bench simulator`: simulated actions per second for each schedule family.

For each size (stages x micro-batches) and schedule: generating the schedule (torch's IR,
validated and laid out), the first simulation (compiles the schedule's memory states), and
the best of `repeat` warm simulations without a timeline (the partitioner's inner loop), plus
one with the timeline recorded (what `pplan simulate` does). Every stage boundary crosses a
link, so the link model is exercised. Every schedule of the registry
(planner.schedules.SCHEDULE_NAMES) is timed unless `schedules` narrows it.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

from planner.bench.table import Table
from planner.errors import PplanError, ScheduleError
from planner.schedules import check_sizes as check_schedule_sizes
from planner.schedules.registry import SCHEDULE_NAMES, get_schedule
from planner.units import plain_int

__all__ = ["bench_simulator", "parse_sizes", "check_sizes", "check_repeats", "MAX_REPEATS", "SCHEDULES"]

SCHEDULES = SCHEDULE_NAMES  # the registry's names (kept under the old name for importers)
MAX_REPEATS = 1000
"""Most repetitions of one bench cell: the best (or median) of a few is the point; a thousand is
far past any use, and `--repeats 1e20` would run practically forever."""


def check_repeats(repeats: int, flag: str = "--repeats") -> int:
    """`repeats` when it is a whole number in 1..MAX_REPEATS, else PplanError naming `flag`."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or not 1 <= repeats <= MAX_REPEATS:
        raise PplanError(f"{flag} {repeats!r} must be between 1 and {MAX_REPEATS} (a whole number)", f"a few are enough, e.g. {flag} 3")
    return repeats


def check_sizes(sizes: Sequence[tuple[int, int]], schedules: Sequence[str] = SCHEDULES) -> list[tuple[int, int]]:
    """Refuse a sizes list the bench could not finish: more than MAX_BENCH_LIST sizes, a size given
    twice, or a size beyond what `pplan simulate` accepts under any of `schedules` (every schedule
    is timed at every size: planner.simulate.check_action_count and torch's micro-batch rules), so
    no size fails after others were timed."""
    from planner.limits import MAX_BENCH_LIST
    from planner.simulate import check_action_count

    sizes = list(sizes)
    if len(sizes) > MAX_BENCH_LIST:
        raise PplanError(f"--sizes lists {len(sizes):,} sizes, more than {MAX_BENCH_LIST}", "bench fewer, e.g. 8x64,64x1024")
    if len(set(sizes)) != len(sizes):
        raise PplanError("--sizes repeats a size", "give each STAGESxMICROBATCHES once, e.g. 8x64,64x1024")
    most_first = sorted(schedules, key=lambda n: not get_schedule(n).split_backward)  # a split backward has the most actions
    for stages, microbatches in sizes:
        for name in most_first:
            v = get_schedule(name).virtual_stages
            try:
                check_action_count(name, stages, microbatches)
                check_schedule_sizes(name, stages // v, microbatches, v)  # torch's rules (M a multiple of P for interleaved)
            except ScheduleError as e:
                raise ScheduleError(f"--sizes {stages}x{microbatches} under {name}: {e.message}", e.hint) from None
    return sizes


def parse_sizes(text: str) -> list[tuple[int, int]]:
    """'8x64,64x1024' -> [(8, 64), (64, 1024)] (stages x micro-batches)."""
    out = []
    for item in text.split(","):
        a, sep, b = item.strip().lower().partition("x")
        try:
            S, M = plain_int(a), plain_int(b)
        except ValueError:
            raise PplanError(f"--sizes item {item.strip()!r} is not STAGESxMICROBATCHES", "write it like 8x64,64x1024") from None
        if not sep or S < 2 or M < 1 or S % 2:
            raise PplanError(f"--sizes item {item.strip()!r} needs an even stage count >= 2 and micro-batches >= 1",
                             "interleaved puts 2 stages on each device, e.g. 8x64,64x1024")
        out.append((S, M))
    if not out:
        raise PplanError(f"--sizes {text!r} names no size", "write it like 8x64,64x1024")
    return out


def _stage(s: int, n: int):
    from planner.cost import StageCost

    # one layer per stage, backward twice the forward, split evenly into I and W
    return StageCost(first=s, end=s + 1, recompute=(), fwd_ms=1.0, bwd_ms=2.0, bwd_input_ms=1.0,
                     bwd_weight_ms=1.0, recompute_ms=0.0, optimizer_ms=0.1, param_bytes=1e6,
                     static_bytes=4e6, kept_bytes=1e5, transient_bytes=0.0,
                     input_bytes=1e5 if s else 0.0, output_bytes=1e5 if s < n - 1 else 0.0)


def bench_simulator(sizes: Sequence[tuple[int, int]] = ((8, 64), (32, 256), (64, 1024)),
                    schedules: Sequence[str] = SCHEDULES, repeat: int = 3,
                    progress: Callable[[str], None] | None = None) -> Table:
    """Time generation and simulation of every schedule at every size (check_repeats, check_sizes
    refuse what it could not finish, before anything runs)."""
    from planner.plan import Device, Links
    from planner.schedules import generate
    from planner.simulate import simulate_costs

    check_repeats(repeat)
    bad = [s for s in schedules if s not in SCHEDULES]
    if bad:
        raise PplanError(f"unknown schedule {bad[0]!r}", f"use some of {', '.join(SCHEDULES)}")
    check_sizes(sizes, schedules)
    say = progress or (lambda _m: None)
    rows = []
    for S, M in sizes:
        stages = [_stage(s, S) for s in range(S)]
        for name in schedules:
            v = get_schedule(name).virtual_stages
            P = S // v
            say(f"simulator: {name} {S} stages x {M} micro-batches")
            t0 = time.perf_counter()
            sch = generate(name, P, M, v)
            gen_s = time.perf_counter() - t0
            devices = [Device(f"d{i}") for i in range(P)]
            placement = [s % P for s in range(S)]

            def run(timeline: bool = False) -> float:
                t = time.perf_counter()
                simulate_costs(sch, stages, placement, devices, Links(), micro_batch_size=1, record_timeline=timeline)
                return time.perf_counter() - t

            first = run()
            warm = min(run() for _ in range(repeat))
            with_tl = run(True)
            n = sum(len(sch.actions(r)) for r in range(P))
            rows.append((name, S, P, M, n, gen_s, first, warm, n / warm if warm > 0 else None, with_tl))
    return Table(
        name="simulator",
        title="Simulator: actions per second by schedule",
        columns=("schedule", "stages", "devices", "microbatches", "actions", "generate_s", "first_sim_s",
                 "warm_sim_s", "actions_per_s", "sim_with_timeline_s"),
        rows=tuple(rows),
        notes=(
            "actions = F/B (or F/I/W for zb) per stage and micro-batch; interleaved runs 2 stages per device.",
            f"warm_sim_s: best of {repeat} simulations without a timeline (the partitioner's inner loop); "
            "sim_with_timeline_s records every box and the memory curve, as `pplan simulate` does.",
            "generate_s includes validation and the deadlock dry run; generated schedules are cached per process.",
        ),
        summary={f"{r[0]}_{r[1]}x{r[3]}_actions_per_s": r[8] for r in rows},
    )
