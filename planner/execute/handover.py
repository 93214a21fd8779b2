"""What one hand-over between two CPU ranks costs, idle and while every core computes (measured).

`pplan bench handover` (planner.bench.handover) prints it as a table; `pplan calibrate --machine`
(planner.execute.machinebench) fits the machine's hand-over cost from its compute rows.

Two processes (gloo on 127.0.0.1, one torch thread each) exchange a tensor of a few sizes, one way
(rank 0 sends, rank 1 receives) or both ways at once, in two modes:

- **idle**: after a barrier both ranks post the exchange and wait for it; a sample is one rank's
  time from posting to the end of its wait.
- **compute**: after a barrier both ranks post the exchange, then run a fixed amount of work (a
  fixed count of 128 x 128 matmuls, calibrated once to take about WORK_MS; not a wall-clock spin,
  which would absorb a preemption inside the spin and hide it), then wait. A sample is one rank's
  (post + work + wait) minus the median time of the same work with nothing posted, measured in the
  same run with iterations alternating (with, without, with, ...) so that load drifts cancel.

Both ranks' samples are pooled: a sample is what one rank lost in one exchange. In compute mode
each rank also records its compute thread's CPU time during the work, so the extra splits into
the wait after the work and the time the compute thread was off its core (displaced, e.g. by
gloo's own thread), which is what the hypothesis in the table's notes is about.

Each rank is `python -c` on `_rank_main` (not multiprocessing's spawn, which re-runs the caller's
`__main__`), in its own session: the parent polls them against a deadline, and stops both however
the bench ends (an error, the deadline, Ctrl-C); a rank exits if its parent disappears, and a
hung peer fails the other rank's collective after the process-group timeout.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable

from planner.errors import RunError
from planner.hostinfo import load_average

__all__ = ["HandoverSettings", "FULL", "QUICK", "COLUMNS", "WORK_MS", "MATMUL_N", "run_ranks", "handover_rows", "measure_handover"]

WORK_MS = 5.0
"""Target duration of the fixed work in compute mode: about one CPU pipeline action (a few ms)."""
MATMUL_N = 128  # a 128 x 128 matmul: ~0.05 ms on one core, so the work is ~100 calls of one kernel
_PG_TIMEOUT_S = 60.0  # a peer silent this long fails the other rank's collective
_POLL_S = 0.1
_PROGRESS = "[handover] "

COLUMNS = ("mode", "direction", "size_kib", "samples", "work_ms", "median_ms", "mean_ms", "p95_ms", "max_ms",
           "over_1ms_pct", "wait_mean_ms", "off_cpu_mean_ms")


@dataclass(frozen=True)
class HandoverSettings:
    """How much to measure."""

    sizes_bytes: tuple[int, ...]
    """Message sizes, in bytes (float32 tensors of size / 4 elements)."""
    reps: int
    """Measured exchanges per rank and cell (compute mode: as many again without an exchange)."""
    warmup: int
    """Unrecorded exchanges before each cell (connection set-up, first-touch of buffers)."""
    timeout_s: float
    """The whole bench's deadline: both ranks are stopped and RunError raised after it."""


FULL = HandoverSettings(sizes_bytes=(64 * 1024, 256 * 1024, 1024 * 1024), reps=300, warmup=20, timeout_s=600.0)
QUICK = HandoverSettings(sizes_bytes=(64 * 1024,), reps=8, warmup=2, timeout_s=180.0)


# ---------------------------------------------------------------- the rank side (runs in a child process)

def _post(dist: Any, rank: int, direction: str, send: Any, recv: Any) -> list[Any]:
    """Post this rank's half of the exchange without waiting: uni, 0 -> 1; bidir, both ways."""
    peer = 1 - rank
    if direction == "bidir":
        return [dist.isend(send, peer), dist.irecv(recv, peer)]
    return [dist.isend(send, peer)] if rank == 0 else [dist.irecv(recv, peer)]


def _calibrate_ops(torch: Any, dist: Any, a: Any, b: Any, c: Any) -> int:
    """Matmul count taking about WORK_MS on rank 0 while rank 1 calibrates too (both busy, as in the
    bench); broadcast so that both ranks do the same fixed work."""
    per_op = []
    for _ in range(7):
        t0 = time.thread_time()
        for _ in range(20):
            torch.mm(a, b, out=c)
        per_op.append((time.thread_time() - t0) * 1e3 / 20)
    count = torch.tensor([max(1, round(WORK_MS / max(statistics.median(per_op), 1e-6)))], dtype=torch.int64)
    dist.broadcast(count, src=0)
    return int(count.item())


def _measure_cell(torch: Any, dist: Any, rank: int, direction: str, nbytes: int, ops: int,
                  mats: tuple[Any, Any, Any], reps: int, warmup: int) -> dict[str, list[float]]:
    """One (direction, size): idle times, then compute iterations alternating with and without."""
    send, recv = torch.randn(max(1, nbytes // 4)), torch.empty(max(1, nbytes // 4))
    a, b, c = mats
    out: dict[str, list[float]] = {"idle": [], "with": [], "wait": [], "off_with": [], "alone": [], "off_alone": []}
    for i in range(warmup + reps):
        dist.barrier()
        t0 = time.perf_counter()
        for w in _post(dist, rank, direction, send, recv):
            w.wait()
        if i >= warmup:
            out["idle"].append((time.perf_counter() - t0) * 1e3)
    for i in range(2 * (warmup + reps)):
        exchange = i % 2 == 0
        dist.barrier()
        t0, c0 = time.perf_counter(), time.thread_time()
        works = _post(dist, rank, direction, send, recv) if exchange else []
        for _ in range(ops):
            torch.mm(a, b, out=c)
        t1, c1 = time.perf_counter(), time.thread_time()
        for w in works:
            w.wait()
        t2 = time.perf_counter()
        if i < 2 * warmup:
            continue
        off_cpu = max(0.0, (t1 - t0) - (c1 - c0)) * 1e3
        if exchange:
            out["with"].append((t2 - t0) * 1e3)
            out["wait"].append((t2 - t1) * 1e3)
            out["off_with"].append(off_cpu)
        else:
            out["alone"].append((t2 - t0) * 1e3)
            out["off_alone"].append(off_cpu)
    return out


def _watch_parent(parent: int) -> None:
    """Exit when the parent is gone (killed with SIGKILL, say): no rank outlives the bench."""
    def watch() -> None:
        while True:
            if os.getppid() != parent:
                os._exit(3)
            time.sleep(0.5)

    threading.Thread(target=watch, daemon=True).start()


def _rank_main() -> None:
    """Entry point of one rank: argv[1] is the JSON config; writes its samples to `result_<rank>.json`."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    cfg = json.loads(sys.argv[1])
    rank = int(os.environ["RANK"])
    _watch_parent(int(cfg["parent"]))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=_PG_TIMEOUT_S))
    try:
        g = torch.Generator().manual_seed(rank)
        mats = (torch.randn(MATMUL_N, MATMUL_N, generator=g), torch.randn(MATMUL_N, MATMUL_N, generator=g),
                torch.empty(MATMUL_N, MATMUL_N))
        ops = _calibrate_ops(torch, dist, *mats)
        cells = {}
        for nbytes in cfg["sizes"]:
            for direction in ("uni", "bidir"):
                if rank == 0:
                    print(f"{_PROGRESS}{direction} {nbytes // 1024} KiB", flush=True)
                cells[f"{direction}/{nbytes}"] = _measure_cell(torch, dist, rank, direction, nbytes, ops, mats,
                                                               cfg["reps"], cfg["warmup"])
        dist.barrier()
        path = Path(cfg["dir"]) / f"result_{rank}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"ops": ops, "cells": cells}), encoding="utf-8")
        os.replace(tmp, path)
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------------------- the parent side

def _pump(stream: IO[str], progress: Callable[[str], None]) -> None:
    for line in iter(stream.readline, ""):
        if line.startswith(_PROGRESS):
            progress(f"handover: {line[len(_PROGRESS):].strip()}")
    stream.close()


def _tail(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "no output"
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return " ".join(lines[-1].split())[:300] if lines else "no output"


def run_ranks(settings: HandoverSettings, work: Path, progress: Callable[[str], None]) -> list[dict[str, Any]]:
    """Start both ranks, wait for them within the deadline, return their results (rank order)."""
    from planner.execute.launch import free_port, stop_processes

    cfg = json.dumps({"parent": os.getpid(), "dir": str(work), "sizes": list(settings.sizes_bytes),
                      "reps": settings.reps, "warmup": settings.warmup})
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC_", "GROUP_", "ROLE_"))}
    # the ranks import this module, also from a checkout that is not installed
    root = str(Path(__file__).resolve().parents[2])
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE="2", OMP_NUM_THREADS="1",
               PYTHONUNBUFFERED="1", PYTHONPATH=os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")])))
    code = "from planner.execute.handover import _rank_main; _rank_main()"
    procs: list[subprocess.Popen] = []
    try:
        for r in range(2):
            with open(work / f"rank{r}.err", "w", encoding="utf-8") as err:
                procs.append(subprocess.Popen([sys.executable, "-c", code, cfg], env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                                              stdin=subprocess.DEVNULL, stderr=err, text=True, start_new_session=True,
                                              stdout=subprocess.PIPE if r == 0 else subprocess.DEVNULL))
        pump = threading.Thread(target=_pump, args=(procs[0].stdout, progress), daemon=True)
        pump.start()
        deadline = time.monotonic() + settings.timeout_s
        while True:
            codes = [p.poll() for p in procs]
            if all(c == 0 for c in codes):
                break
            failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                time.sleep(0.4)  # the peer of a failed rank fails soon after: name the first cause
                r = failed[0]
                raise RunError(f"handover bench: rank {r} exited with code {codes[r]}: {_tail(work / f'rank{r}.err')}",
                               "check that 127.0.0.1 accepts local TCP connections and that torch imports; rerun")
            if time.monotonic() > deadline:
                raise RunError(f"handover bench: the ranks did not finish within {settings.timeout_s:g} s",
                               "the machine may be overloaded (load average " f"{load_average()}); rerun when it is quieter")
            time.sleep(_POLL_S)
        pump.join(timeout=2.0)
    finally:
        stop_processes(procs)
    return [json.loads((work / f"result_{r}.json").read_text(encoding="utf-8")) for r in range(2)]


# ---------------------------------------------------------------- statistics and the table

def _p95(xs: list[float]) -> float:
    """Nearest-rank 95th percentile."""
    s = sorted(xs)
    return s[max(0, math.ceil(0.95 * len(s)) - 1)]


def _stats(xs: list[float]) -> tuple[float, float, float, float, float]:
    """(median, mean, p95, max, percent over 1 ms)."""
    return (statistics.median(xs), statistics.fmean(xs), _p95(xs), max(xs), 100.0 * sum(x > 1.0 for x in xs) / len(xs))


def handover_rows(results: list[dict[str, Any]], settings: HandoverSettings) -> list[tuple[Any, ...]]:
    rows: list[tuple[Any, ...]] = []
    for mode in ("idle", "compute"):
        for nbytes in settings.sizes_bytes:
            for direction in ("uni", "bidir"):
                cells = [res["cells"][f"{direction}/{nbytes}"] for res in results]
                if mode == "idle":
                    samples = [x for c in cells for x in c["idle"]]
                    rows.append(("idle", direction, nbytes // 1024, len(samples), None, *_stats(samples), None, None))
                    continue
                extra = [x - statistics.median(c["alone"]) for c in cells for x in c["with"]]
                work_ms = statistics.median([x for c in cells for x in c["alone"]])
                wait = statistics.fmean([x for c in cells for x in c["wait"]])
                off = statistics.fmean([statistics.fmean(c["off_with"]) - statistics.fmean(c["off_alone"]) for c in cells])
                rows.append(("compute", direction, nbytes // 1024, len(extra), work_ms, *_stats(extra), wait, off))
    return rows


def measure_handover(settings: HandoverSettings = FULL, progress: Callable[[str], None] | None = None,
                     ) -> tuple[list[tuple[Any, ...]], int]:
    """(one row per (mode, size, direction) in COLUMNS' order, the fixed work's matmul count):
    two local ranks measured as the module docstring says."""
    say = progress or (lambda _msg: None)
    say(f"handover: starting 2 ranks (sizes {', '.join(f'{n // 1024} KiB' for n in settings.sizes_bytes)})")
    with tempfile.TemporaryDirectory(prefix="pplan-handover-") as tmp:
        results = run_ranks(settings, Path(tmp), say)
    return handover_rows(results, settings), int(results[0]["ops"])

