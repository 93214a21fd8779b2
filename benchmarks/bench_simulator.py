"""Simulator speed: 64 stages x 1024 micro-batches per schedule, printed (never asserted).

    python benchmarks/bench_simulator.py [--stages 64] [--microbatches 1024] [--repeat 3]

For each schedule: the time to generate and validate the schedule (cached after the first call
in a process), the first simulation (compiles the schedule's memory states), and the best of
`--repeat` warm simulations with record_timeline=False, the partitioner's inner loop.
Communication is on (every boundary crosses a link) so the link model is exercised.
"""

from __future__ import annotations

import argparse
import time

from planner.cost import StageCost
from planner.plan import Device, Links
from planner.schedules import generate
from planner.simulate import simulate_costs


def _stage(s: int, n: int) -> StageCost:
    return StageCost(first=s, end=s + 1, recompute=(), fwd_ms=1.0, bwd_ms=2.0, bwd_input_ms=1.0,
                     bwd_weight_ms=1.0, recompute_ms=0.0, optimizer_ms=0.1, param_bytes=1e6,
                     static_bytes=4e6, kept_bytes=1e5, transient_bytes=0.0,
                     input_bytes=1e5 if s else 0.0, output_bytes=1e5 if s < n - 1 else 0.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stages", type=int, default=64)
    ap.add_argument("--microbatches", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    S, M = args.stages, args.microbatches
    print(f"{S} stages x {M} micro-batches")
    print(f"{'schedule':<12} {'ranks':>5} {'actions':>8} {'generate':>9} {'first sim':>10} {'warm sim':>9} {'actions/s':>12}")
    for name, v in (("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb", 1)):
        P = S // v
        t0 = time.perf_counter()
        sch = generate(name, P, M, v)
        t_gen = time.perf_counter() - t0
        stages = [_stage(s, S) for s in range(S)]
        devices = [Device(f"d{i}") for i in range(P)]
        placement = [s % P for s in range(S)]

        def run() -> float:
            t = time.perf_counter()
            simulate_costs(sch, stages, placement, devices, Links(), micro_batch_size=1)
            return time.perf_counter() - t

        first = run()
        warm = min(run() for _ in range(args.repeat))
        n = sum(len(sch.actions(r)) for r in range(P))
        print(f"{name:<12} {P:>5} {n:>8} {t_gen:>8.3f}s {first:>9.3f}s {warm:>8.3f}s {n / warm:>12,.0f}")


if __name__ == "__main__":
    main()
