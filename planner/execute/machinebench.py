"""`pplan calibrate --machine`: measure once what a pipelined step costs beyond its layers.

Three microbenchmarks (a minute or so on 2 CPU processes), once per rank count asked for
(`measure_machines`: `pplan calibrate --machine --ranks 2,4,8`), since what an action and a
hand-over cost grows with the processes sharing the cores:

- **Empty pipeline.** A synthetic model of one layer per rank, 16 features, is profiled, planned
  on `ranks` processes and run by the executor (`pplan run`'s code) for a few (schedule,
  micro-batch) cases. While every rank has a core of its own the layers cost nothing
  (`fwd_ms=0,bwd_ms=0`). With more ranks than cores they sleep (SLEEP_MS): layers that cost nothing
  keep every rank runnable at once, and the steps would measure ranks queueing for a CPU, which no
  plan run on such a machine does (pplan runs more ranks than cores only when they wait most of
  the time: layers that sleep, or wait for an accelerator); the profile holds the slept time.
  Whatever the steps take beyond the profile is torch pipelining's and the backend's fixed cost
  (steadier, too: steps spread 12-43% with 4 and 8 sleeping ranks on 2 cores, 79-204% with layers
  that cost nothing; load 3.6-7.3, 2026-11-30). The simulator, given the same plan, says
  how many actions and hand-overs lie on each case's critical path; a least-squares fit over the
  cases of measured = simulated(action overhead a, hand-over latency l) + c gives a per action and
  c per step, with l the median measured hand-over gap (sender's end to the waiting receiver's start).
  Bandwidth comes from the ping-pong between the ranks (planner.execute.commbench).
- **Optimizer.** One process steps each optimizer on 1 and 16 MiB of parameters; the slope is
  ms per MiB.
- **Contention.** A fixed matmul-and-add kernel timed in one process alone and in `ranks`
  processes at once: the ratio is what sharing memory bandwidth and caches costs a rank's
  compute (layers are profiled alone). Recorded, not applied.
- **Hand-overs under compute.** Where the ranks fill the cores (ranks <= cores), `pplan bench
  handover`'s compute mode at 64 KiB and 1 MiB, both directions: the mean time a rank loses per
  hand-over while both compute, a line through the two sizes (intercept, ms per MiB), which the
  simulator charges to both ends of every cross-rank transfer (planner.cost.handover_cpu_ms).
  With more ranks than cores the plans pplan runs there sleep, leaving cores free: not measured.

The result is a planner.machine.Machine, one entry of the machine file (planner.machine.MachineSet)
that `pplan calibrate --machine` saves.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from planner.errors import PplanError
from planner.limits import OPTIMIZERS

__all__ = ["EMPTY_MODEL", "SLEEP_MS", "CASES", "QUICK_CASES", "empty_model", "measure_machine", "measure_machines",
           "parse_rank_counts", "fit_overheads", "optimizer_ms_per_mib", "kernel_ms", "handover_under_compute",
           "HANDOVER_SIZES", "remeasure_machine_file"]

EMPTY_MODEL = "synthetic:layers={layers},fwd_ms={fwd:g},bwd_ms={bwd:g},param_bytes=4KB,act_bytes=64,hidden=16"
SLEEP_MS = (4.0, 8.0)
"""(forward, backward) ms each layer sleeps when ranks outnumber cores: a rank's own work per action
(~0.3 ms of CPU) is then a few percent of it, as in plans whose layers take milliseconds."""
MAX_RANK_COUNTS = 8
"""Rank counts one `--ranks` list may name (each takes a minute or so)."""
CASES = (("gpipe", 2), ("gpipe", 8), ("1f1b", 8), ("1f1b", 16))
"""(schedule, micro-batches) of the empty-pipeline runs; their action counts differ, so a and c separate."""
QUICK_CASES = (("gpipe", 2), ("1f1b", 8))


def fit_overheads(cases: list[tuple[float, float, float]]) -> tuple[float, float]:
    """(a, c) >= 0 of measured = base + k x a + c, least squares over (measured, base, k) cases.

    base is the simulated step without action overhead, k the simulated step's growth per ms of
    action overhead (the actions on the critical path). Falls back to a through the origin, or c
    alone, when the free fit would make either negative.
    """
    pts = [(m - b, k) for m, b, k in cases if math.isfinite(m) and math.isfinite(b)]
    if not pts:
        return 0.0, 0.0
    n = len(pts)
    my = sum(y for y, _ in pts) / n
    mk = sum(k for _, k in pts) / n
    skk = sum((k - mk) ** 2 for _, k in pts)
    if n >= 2 and skk > 0:
        a = sum((k - mk) * (y - my) for y, k in pts) / skk
        c = my - a * mk
        if a >= 0 and c >= 0:
            return a, c
    sk2 = sum(k * k for _, k in pts)
    origin = (max(0.0, sum(k * y for y, k in pts) / sk2) if sk2 else 0.0, 0.0)
    flat = (0.0, max(0.0, my))

    def sse(ac: tuple[float, float]) -> float:
        return sum((y - ac[0] * k - ac[1]) ** 2 for y, k in pts)

    return min(origin, flat, key=sse)


def empty_model(ranks: int, cores: int) -> str:
    """The empty pipeline's model for `ranks` processes on `cores` cores (module docstring)."""
    fwd, bwd = SLEEP_MS if ranks > cores else (0.0, 0.0)
    return EMPTY_MODEL.format(layers=ranks, fwd=fwd, bwd=bwd)


def parse_rank_counts(text: str, most: int) -> tuple[int, ...]:
    """'2,4,8' -> (2, 4, 8): distinct counts from 2 to `most`, at most MAX_RANK_COUNTS of them."""
    parts = [p.strip() for p in str(text).split(",") if p.strip()]
    if not parts:
        raise PplanError(f"--ranks {str(text)[:40]!r} names no rank count", "e.g. --ranks 2,4,8")
    counts = []
    for p in parts:
        if not p.isdigit() or not 2 <= int(p) <= most:
            raise PplanError(f"--ranks {p[:20]!r} is not a whole number from 2 to {most}",
                             f"hand-overs need two processes; more than {most} on this machine measure contention "
                             "alone (pplan run refuses them without --force)")
        if int(p) not in counts:
            counts.append(int(p))
    if len(counts) > MAX_RANK_COUNTS:
        raise PplanError(f"--ranks names {len(counts)} counts, at most {MAX_RANK_COUNTS}",
                         "measure the counts your plans use, e.g. --ranks 2,4,8")
    return tuple(counts)


def optimizer_ms_per_mib(threads: int, sizes_mib: tuple[float, float] = (1.0, 16.0), reps: int = 7,
                         names: tuple[str, ...] = OPTIMIZERS) -> dict[str, float]:
    """Optimizer step ms per MiB of float32 parameters (slope between two sizes, median of reps)."""
    import torch

    from planner.execute.stages import make_optimizer

    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = {}
        for name in names:
            times = []
            for mib in sizes_mib:
                n = int(mib * 2**20 / 4)
                params = [torch.nn.Parameter(torch.zeros(n // 4)) for _ in range(4)]
                for p in params:
                    p.grad = torch.full_like(p, 1e-3)
                opt = make_optimizer(name, params, 1e-3)
                samples = []
                for i in range(reps + 2):
                    t0 = time.perf_counter()
                    opt.step()
                    if i >= 2:
                        samples.append((time.perf_counter() - t0) * 1e3)
                times.append(statistics.median(samples))
            slope = (times[1] - times[0]) / (sizes_mib[1] - sizes_mib[0])
            out[name] = max(0.0, slope)
        return out
    finally:
        torch.set_num_threads(old)


def kernel_ms(threads: int, reps: int = 15, start_at: float | None = None) -> float:
    """Median ms of a fixed kernel: a 512 x 1024 by 1024 x 1024 matmul and a 16 MiB add (from
    wall-clock time `start_at`, so that processes started together run together)."""
    import torch

    torch.set_num_threads(threads)
    if start_at is not None:
        time.sleep(max(0.0, start_at - time.time()))
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(512, 1024, generator=g), torch.randn(1024, 1024, generator=g)
    x = torch.randn(4 * 2**20, generator=g)
    samples = []
    for i in range(reps + 2):
        t0 = time.perf_counter()
        (a @ b).sum()
        (x + 1.0).sum()
        if i >= 2:
            samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def _kernel_processes(n: int, threads: int) -> list[float]:
    """kernel_ms in n fresh processes started together."""
    start_at = time.time() + 4.0  # after every process has imported torch
    code = f"from planner.execute.machinebench import kernel_ms; print(kernel_ms({threads}, start_at={start_at!r}))"
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
             for _ in range(n)]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=300)
        if p.returncode != 0:
            raise PplanError(f"the contention kernel failed: {stderr.decode(errors='replace').strip()[-200:]}")
        out.append(float(stdout.decode().strip().splitlines()[-1]))
    return out


def _empty_pipeline(ranks: int, threads: int, cases: tuple[tuple[str, int], ...], steps: int, work: Path,
                    say: Callable[[str], None]) -> tuple[list[dict[str, Any]], list[tuple[float, float, float]], list[float],
                                                         list[float], float | None, str]:
    from planner.calibration import Calibration
    from planner.execute.options import RunOptions
    from planner.execute.run import run_plan
    from planner.hostinfo import usable_cores
    from planner.partition.api import partition
    from planner.partition.search import PartitionSettings
    from planner.plan import write_plan
    from planner.profiling.profile import load_profile, write_profile
    from planner.profiling.profiler import profile_model
    from planner.simulate import simulate

    spec = empty_model(ranks, usable_cores())
    say(f"profiling the empty model {spec}")
    prof_path = work / "empty.csv"
    write_profile(profile_model(spec, [1], warmup=2, repeats=5, threads=threads), prof_path)
    prof = load_profile(prof_path)
    rows, fit_cases, gaps, actions = [], [], [], []
    bandwidth = None
    for i, (schedule, m) in enumerate(cases):
        last = i == len(cases) - 1
        say(f"empty pipeline {i + 1}/{len(cases)}: {schedule}, {m} micro-batches on {ranks} processes")
        settings = PartitionSettings(n_devices=ranks, memory_bytes=None, global_batch=m, microbatches=m, schedule=schedule)
        plan = partition(prof, settings).plan
        plan_path = work / f"empty-{schedule}-{m}.json"
        write_plan(plan, plan_path)
        opts = RunOptions(steps=steps, warmup=3, device="cpu", threads=threads, calibrate=last, track_memory=False)
        outcome = run_plan(plan, opts, plan_path=str(plan_path), use_machine=False)
        run = outcome.record
        if last:
            bws = [c.bandwidth_bytes_per_s for c in run.comm if c.bandwidth_bytes_per_s]
            bandwidth = statistics.median(bws) if bws else None
        gaps += [g for _, g in run.transfer_gaps]
        actions += [v for r in run.ranks for k, v in r.action_ms.items() if k[-1] in "FBIW"]
        rows.append({"schedule": schedule, "microbatches": m, "measured_ms": run.iteration_ms_measured,
                     "step_spread_pct": run.step_spread_pct, "plan": plan})
    latency = statistics.median(gaps) if gaps else 0.0
    bw = bandwidth or 1e9
    for row in rows:
        plan = row.pop("plan")
        base = simulate(plan, prof, calibration=Calibration(comm_latency_ms=latency, comm_bandwidth_bytes_per_s=bw),
                        record_timeline=False).iteration_ms
        plus = simulate(plan, prof, calibration=Calibration(action_overhead_ms=1.0, comm_latency_ms=latency,
                                                            comm_bandwidth_bytes_per_s=bw),
                        record_timeline=False).iteration_ms
        row["simulated_base_ms"], row["actions_on_path"] = base, plus - base
        fit_cases.append((row["measured_ms"], base, plus - base))
    return rows, fit_cases, gaps, actions, bandwidth, spec


def measure_machine(*, ranks: int = 2, threads: int | None = None, quick: bool = False, steps: int = 30,
                    progress: Callable[[str], None] | None = None):
    """Run the microbenchmarks on this machine (CPU, gloo) and return a planner.machine.Machine."""
    from planner.hostinfo import cpu_model, usable_cores
    from planner.machine import Machine

    say = progress or (lambda _m: None)
    if ranks < 2:
        raise PplanError(f"--ranks {ranks} must be at least 2 (hand-overs need two processes)")
    threads = threads or max(1, usable_cores() // ranks)
    t_start = time.perf_counter()
    load = round(os.getloadavg()[0], 2)
    with tempfile.TemporaryDirectory(prefix="pplan-machine-") as tmp:
        rows, fit_cases, gaps, actions, bandwidth, spec = _empty_pipeline(
            ranks, threads, QUICK_CASES if quick else CASES, steps, Path(tmp), say)
    a, c = fit_overheads(fit_cases)
    latency = statistics.median(gaps) if gaps else 0.0
    say("optimizer step cost")
    opt = optimizer_ms_per_mib(threads, reps=3 if quick else 7)
    say(f"contention: one process alone, then {ranks} at once")
    alone = statistics.median(_kernel_processes(1, threads))
    together = statistics.median(_kernel_processes(ranks, threads))
    handover = handover_under_compute(quick, say) if ranks <= usable_cores() else (None, None)
    for row in rows:
        row["predicted_ms"] = row["simulated_base_ms"] + row["actions_on_path"] * a + c
        row["action_ms_median"] = statistics.median(actions) if actions else None
    import torch

    measured = {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "host": socket.gethostname(), "cpu": cpu_model(), "cores": usable_cores(),
        "load_average": load, "torch": torch.__version__, "seconds": round(time.perf_counter() - t_start, 1),
        "cases": json.loads(json.dumps(rows)), "model": spec,
    }
    return Machine(device_type="cpu", backend="gloo", ranks=ranks, threads=threads, action_overhead_ms=a,
                   comm_latency_ms=max(0.0, latency), comm_bandwidth_bytes_per_s=bandwidth or 1e9,
                   step_overhead_ms=c, optimizer_ms_per_mib=opt,
                   concurrent_compute_ratio=together / alone if alone > 0 else None,
                   handover_cpu_ms=handover[0], handover_cpu_ms_per_mib=handover[1], measured=measured)


HANDOVER_SIZES = (64 * 1024, 1024 * 1024)
"""Message sizes of the hand-over fit (bytes): the small and the large end of the bench's."""


def handover_under_compute(quick: bool = False, progress: Callable[[str], None] | None = None,
                           ) -> tuple[float, float]:
    """(ms per hand-over, ms per MiB) a rank loses while both ranks compute: `pplan bench handover`'s
    compute rows at HANDOVER_SIZES, one way and both ways averaged per size, the line through them
    (each part at least 0)."""
    from planner.execute.handover import COLUMNS, HandoverSettings, measure_handover

    settings = HandoverSettings(sizes_bytes=HANDOVER_SIZES, reps=20 if quick else 150, warmup=5 if quick else 20,
                                timeout_s=600.0)
    rows, _ = measure_handover(settings, progress)
    col = {name: k for k, name in enumerate(COLUMNS)}
    means = {size: statistics.fmean(float(r[col["mean_ms"]]) for r in rows
                                    if r[col["mode"]] == "compute" and int(r[col["size_kib"]]) * 1024 == size)
             for size in HANDOVER_SIZES}
    small, large = HANDOVER_SIZES
    slope = max(0.0, (means[large] - means[small]) / ((large - small) / 2**20))
    return max(0.0, means[small] - slope * small / 2**20), slope


def measure_machines(counts: tuple[int, ...], *, base: Any = None, progress: Callable[[str], None] | None = None,
                     **kwargs: Any):
    """measure_machine once per rank count; a planner.machine.MachineSet of `base`'s entries (a
    MachineSet, or None) with those counts replaced by the new measurements."""
    from planner.machine import MachineSet

    say = progress or (lambda _m: None)
    machines = base
    for i, ranks in enumerate(counts):
        say(f"{ranks} ranks ({i + 1} of {len(counts)} counts)")
        m = measure_machine(ranks=ranks, progress=say, **kwargs)
        machines = MachineSet((m,)) if machines is None else machines.with_entry(m)
    return machines


def remeasure_machine_file(target: Path, counts: tuple[int, ...], *, progress: Callable[[str], None] | None = None,
                           warn: Callable[[str], None] | None = None, **kwargs: Any) -> tuple[Any, Path]:
    """Measure `counts` and save the machine file `target`, keeping its entries for other counts
    (`pplan calibrate --machine`). A machine file that cannot be read is replaced, after `warn` says
    what is dropped; a target that cannot be written, or that is some other file
    (planner.machine.machines_to_update), is refused before minutes of measuring. Returns (the
    MachineSet, its path)."""
    from planner.atomic import ensure_writable_file
    from planner.machine import machines_to_update, save_machine

    ensure_writable_file(target, "machine file")  # a new file too: its folder must be writable
    base, unreadable = machines_to_update(target)
    if unreadable is not None and warn is not None:
        warn(f"replacing the unreadable machine file {unreadable[:400]}")
    machines = measure_machines(counts, base=base, progress=progress, **kwargs)
    return machines, save_machine(machines, target)
