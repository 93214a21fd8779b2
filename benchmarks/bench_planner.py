"""Benchmarks of `pplan partition`: search speed, DP vs ILP by size, and plan quality vs baselines.

    .venv/bin/python benchmarks/bench_planner.py [--quick] [--ilp-limit 60]

Prints tables; asserts nothing (numbers go to docs/planner.md). Sections:
  1. full search (every M dividing the batch, every schedule, recompute auto) for a 200-layer
     synthetic profile on 16 devices; and the DP alone for 1,000 layers x 64 devices;
  2. ILP vs DP solve time as the instance grows, and where the ILP gets slow;
  3. quality: the chosen plan (and the DP's own plan) against the uniform, parameter- and
     time-balanced baselines on gpt-like and imbalanced synthetic profiles (and profiles/*.csv
     when present), at memory limits from generous to just above the least that works.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.errors import PplanError  # noqa: E402
from planner.partition import PartitionSettings, partition  # noqa: E402
from planner.partition.build import Layout, build_problem  # noqa: E402
from planner.partition.diagnose import least_memory_scale  # noqa: E402
from planner.partition.dp import min_memory_scale, solve_dp  # noqa: E402
from planner.partition.ilp import ilp_solver_name, solve_ilp  # noqa: E402
from planner.partition.synthetic import gpt_like, imbalanced, uniform_layers  # noqa: E402
from planner.plan import Device, Links  # noqa: E402
from planner.profiling.profile import Profile, load_profile  # noqa: E402
from planner.schedules import generate  # noqa: E402
from planner.schedules.memory import stage_inflight_peak  # noqa: E402
from planner.units import format_bytes  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


class Took(float):
    """Best wall-clock seconds of the repeats, printed with the CPU seconds of that run (the
    machine may be shared: CPU time shows what the planner itself costs)."""

    cpu: float = 0.0

    def __format__(self, spec: str) -> str:
        return f"{format(float(self), spec)} s wall / {format(self.cpu, spec)} s CPU"


def timed(fn, repeat: int = 1):
    best, cpu, out = float("inf"), 0.0, None
    for _ in range(repeat):
        t, c = time.perf_counter(), time.process_time()
        out = fn()
        wall = time.perf_counter() - t
        if wall < best:
            best, cpu = wall, time.process_time() - c
    took = Took(best)
    took.cpu = cpu
    return took, out


def static_bytes(profile: Profile) -> float:
    return 4.0 * float(profile.columns["param_bytes"][:, 0].sum())  # weights, grads, Adam moments


def speed_section(quick: bool) -> None:
    print("== 1. speed ==")
    prof = imbalanced(200, seed=1)
    memory = int(static_bytes(prof) / 16 * 1.5 + 3e9)
    for recompute in ("auto", "none"):
        settings = PartitionSettings(n_devices=16, memory_bytes=memory, global_batch=64, recompute=recompute)
        t, res = timed(lambda: partition(prof, settings), repeat=1 if quick else 3)
        n_points = len({c.point for c in res.search.candidates})
        print(f"full search, 200 layers x 16 devices, batch 64, recompute {recompute}: {t:.2f} "
              f"({n_points} (schedule, M) points x DP + 3 baselines, polish; plan {res.plan.schedule} M={res.plan.n_microbatches})")
    big = imbalanced(1000, seed=2)
    costs = big.at(4)
    sched = generate("1f1b", 64, 64)
    for recompute in ("none", "auto"):
        def problem_at(limit: float):
            layout = Layout(tuple(Device(f"d{i}", int(limit)) for i in range(64)), tuple(range(64)), Links())
            return build_problem(costs, layout, stage_inflight_peak(sched), optimizer="adam", recompute=recompute)

        least = min_memory_scale(problem_at(2**40))[0] * 2**40  # memory binds: 15% above the least that fits
        problem = problem_at(least * 1.15)
        t, sol = timed(lambda: solve_dp(problem), repeat=1 if quick else 3)
        rec = sum(len(r) for r in sol.recompute)
        print(f"DP alone, 1000 layers x 64 devices (1f1b, M=64), recompute {recompute}, memory {format_bytes(least * 1.15)}: "
              f"{t:.2f} (bottleneck {sol.bottleneck_ms:.1f} ms, {rec} layers recomputed)")
    print()


def ilp_section(limit: float, quick: bool) -> None:
    print(f"== 2. ILP ({ilp_solver_name()}, time limit {limit:.0f} s per pass) vs DP ==")
    sizes = [(8, 2), (12, 3), (16, 4), (24, 4), (32, 4), (48, 6), (64, 8), (96, 8)]
    if quick:
        sizes = sizes[:4]
    print(f"{'layers':>6} {'stages':>6} {'DP s':>8} {'ILP s':>8} {'ILP proven':>10} {'same optimum':>12}  (wall-clock)")
    for L, S in sizes:
        prof = imbalanced(L, seed=L)
        costs = prof.at(2)
        inflight = stage_inflight_peak(generate("1f1b", S, 2 * S))

        def problem_at(limit: float):
            layout = Layout(tuple(Device(f"d{i}", int(limit)) for i in range(S)), tuple(range(S)), Links())
            return build_problem(costs, layout, inflight, optimizer="adam", recompute="auto")

        problem = problem_at(min_memory_scale(problem_at(2**40))[0] * 2**40 * 1.2)  # memory binds: recompute matters
        t_dp, dp = timed(lambda: solve_dp(problem))
        t_ilp, ilp = timed(lambda: solve_ilp(problem, time_limit=limit))
        same = (dp is None and ilp is None) or (dp is not None and ilp is not None and abs(dp.bottleneck_ms - ilp.bottleneck_ms) <= 1e-6 * dp.bottleneck_ms)
        proven = "-" if ilp is None else ("yes" if ilp.optimal else "no")
        print(f"{L:>6} {S:>6} {float(t_dp):>8.3f} {float(t_ilp):>8.2f} {proven:>10} {str(same):>12}")
        if t_ilp > limit:
            print(f"ILP hit its time limit at {L} layers x {S} stages; larger sizes skipped")
            break
    print()


def _profiles(quick: bool) -> list[tuple[str, Profile]]:
    out = [("gpt-24", gpt_like(24)), ("gpt-48-bigvocab", gpt_like(48, hidden=1024, vocab=128_000))]
    out += [(f"imbalanced-{n}-s{s}", imbalanced(n, seed=s)) for n, s in ((64, 0), (200, 1))]
    out.append(("uniform-32", uniform_layers(32)))
    for path in sorted((ROOT / "profiles").glob("*.csv")):
        try:
            out.append((path.stem, load_profile(path)))
        except PplanError as e:
            print(f"skipping {path}: {e.one_line()}")
    return out[:3] if quick else out


def quality_section(quick: bool) -> None:
    print("== 3. quality: simulated iteration time, plan vs baselines (x = baseline / plan; OOM = no setting fits) ==")
    header = f"{'profile':<22} {'dev':>3} {'memory':>10} {'plan':<26} {'iter ms':>9} {'uniform':>8} {'params':>8} {'time':>8} {'raw DP':>8}"
    print(header)
    print("-" * len(header))
    worst = 1.0
    ooms = {"uniform": 0, "params": 0, "time": 0}
    no_rec = {"plan": 0, "uniform": 0, "params": 0, "time": 0}  # OOMs when nobody may recompute
    rows = 0
    for name, prof in _profiles(quick):
        for n in (4, 8):
            if n > prof.n_layers:
                continue
            base = PartitionSettings(n_devices=n, memory_bytes=None, global_batch=32)
            devs = tuple(Device(f"d{i}", 2**40) for i in range(n))
            scale = least_memory_scale(prof, base, devs, Links(), [tuple(range(n))], None)
            least = scale * 2**40
            for label, memory in (("unlimited", None), ("2x least", int(least * 2)), ("1.1x least", int(least * 1.1))):
                settings = replace(base, memory_bytes=memory)
                try:
                    res = partition(prof, settings)
                except PplanError as e:
                    print(f"{name:<22} {n:>3} {label:>10} error: {e.one_line()[:80]}")
                    continue
                plan_ms = res.plan.predicted["iteration_ms"]
                cells = []
                for method in ("uniform", "params", "time"):
                    mine = [c for c in res.search.candidates if c.method == method and c.fits]
                    if not mine:
                        cells.append("OOM")
                        ooms[method] += 1
                        continue
                    ratio = min(c.iteration_ms for c in mine) / plan_ms
                    worst = min(worst, ratio)
                    cells.append(f"{ratio:.2f}x")
                dp_ms = min((c.iteration_ms for c in res.search.candidates if c.method == "dp" and c.fits), default=float("inf"))
                best_base = min((c.iteration_ms for c in res.search.candidates if c.method in ("uniform", "params", "time") and c.fits),
                                default=float("inf"))
                plan = f"{res.plan.schedule} M={res.plan.n_microbatches} {res.chosen.method}"
                mem = "unlimited" if memory is None else format_bytes(memory)
                raw = f"{best_base / dp_ms:.2f}x" if np.isfinite(best_base) and np.isfinite(dp_ms) else ("OOM" if not np.isfinite(dp_ms) else "-")
                print(f"{name[:22]:<22} {n:>3} {mem:>10} {plan:<26} {plan_ms:>9.1f} {cells[0]:>8} {cells[1]:>8} {cells[2]:>8} {raw:>8}")
                rows += 1
                try:
                    strict = partition(prof, replace(settings, recompute="none"))
                    for method in ("uniform", "params", "time"):
                        no_rec[method] += not any(c.method == method and c.fits for c in strict.search.candidates)
                except PplanError:
                    no_rec["plan"] += 1
                    for method in ("uniform", "params", "time"):
                        no_rec[method] += 1
    print(f"\n{rows} settings; plan never slower than a baseline: {worst >= 1 - 1e-12} (smallest ratio {worst:.3f}); "
          f"baseline OOMs: {ooms}")
    print(f"with --recompute none at the same memory, settings where nothing fits: {no_rec}")
    print("raw DP = best fitting baseline / the DP's own cuts before the polish: below 1.00x a baseline beat the raw DP.")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller sizes, one repetition")
    ap.add_argument("--ilp-limit", type=float, default=60.0, help="ILP time limit per pass, seconds")
    ap.add_argument("--only", choices=("speed", "ilp", "quality"), help="run one section")
    args = ap.parse_args()
    if args.only in (None, "speed"):
        speed_section(args.quick)
    if args.only in (None, "ilp"):
        ilp_section(args.ilp_limit, args.quick)
    if args.only in (None, "quality"):
        quality_section(args.quick)


if __name__ == "__main__":
    main()
