"""`pplan bench fidelity`: predicted against measured step time and peak memory.

For each model, device count, schedule and micro-batch count of the grid, `partition` makes
the plan with that schedule and count forced (the plan the user would get), the simulator
predicts it from the profile just measured (no calibration), and the executor trains it for a
few steps. Errors are 100 x (predicted - measured) / measured; the mean absolute percentage
error (MAPE) is over the runs that completed. Peak memory compares each rank's predicted peak
with the executor's measure (CUDA allocator peak on GPU; on CPU weights, gradients, optimizer
state, saved activations and buffers: docs/executor.md) and averages the ranks.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from planner.bench.table import Table
from planner.errors import PplanError
from planner.schedules.registry import SCHEDULE_NAMES

__all__ = ["FidelityPoint", "DEFAULT_GRID", "QUICK_GRID", "bench_fidelity"]

_SYN16 = ("synthetic:layers=16,fwd_ms=3/5/3/4/6/3/4/5/3/4/5/3/6/4/3/5,bwd_ms=6/10/6/8/12/6/8/10/6/8/10/6/12/8/6/10,"
          "param_bytes=2MB,act_bytes=1MB")
_GPT = "gpt:layers=4,hidden=128,heads=4,seq=64,vocab=2048"
_SYN_QUICK = "synthetic:layers=4,fwd_ms=4/6/4/6,bwd_ms=8/12/8/12,param_bytes=1MB,act_bytes=1MB"
_ALL = SCHEDULE_NAMES


@dataclass(frozen=True)
class FidelityPoint:
    """One group of the grid: a model on a device count, at several schedules and counts."""

    label: str
    """Short model name for the table."""
    spec: str
    """Model spec (`--model`)."""
    devices: int
    """Pipeline devices (ranks)."""
    schedules: tuple[str, ...]
    """Schedules to try."""
    microbatches: tuple[int, ...]
    """Micro-batch counts to try."""
    micro_batch_size: int = 2
    """Samples per micro-batch (the profile measures exactly this size)."""


DEFAULT_GRID: tuple[FidelityPoint, ...] = (
    FidelityPoint("synthetic", _SYN16, 4, _ALL, (4, 8)),
    FidelityPoint("synthetic", _SYN16, 8, _ALL, (8,)),
    FidelityPoint("gpt", _GPT, 2, _ALL, (4, 8)),
)
QUICK_GRID: tuple[FidelityPoint, ...] = (
    FidelityPoint("synthetic", _SYN_QUICK, 2, ("gpipe", "1f1b"), (2,)),
)


def _pct(pred: float | None, meas: float | None) -> float | None:
    if pred is None or meas is None or meas <= 0:
        return None
    return 100.0 * (pred - meas) / meas


def _mape(values: list[float | None]) -> float | None:
    vals = [abs(v) for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def _fmt_pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}%"


def bench_fidelity(grid: Sequence[FidelityPoint] = DEFAULT_GRID, steps: int = 5, warmup: int = 2,
                   device: str = "cpu", progress: Callable[[str], None] | None = None) -> Table:
    """Run every grid point on the executor and compare with the simulator's prediction."""
    from planner.bench.execution import profile_to, run_measured
    from planner.partition.api import partition
    from planner.partition.search import PartitionSettings

    if steps <= warmup:
        raise PplanError(f"--steps {steps} must exceed --warmup {warmup}", "e.g. --steps 5 --warmup 2")
    say = progress or (lambda _m: None)
    total = sum(len(g.schedules) * len(g.microbatches) for g in grid)
    rows: list[tuple[Any, ...]] = []
    done = 0
    with tempfile.TemporaryDirectory(prefix="pplan-bench-") as tmp:
        work = Path(tmp)
        for g in grid:
            prof = profile_to(g.spec, [g.micro_batch_size], work, say, device=device)
            for name in g.schedules:
                for m in g.microbatches:
                    done += 1
                    say(f"fidelity {done}/{total}: {g.label} on {g.devices} devices, {name}, M={m}")
                    settings = PartitionSettings(n_devices=g.devices, memory_bytes=None, global_batch=m * g.micro_batch_size,
                                                 microbatches=m, schedule=name)
                    try:
                        plan = partition(prof, settings).plan
                    except PplanError as e:
                        rows.append((g.label, g.devices, name, m, None, None, None, None, None, None, f"not planned: {e.one_line()[:120]}"))
                        continue
                    run = run_measured(plan, work, f"f-{g.label}-{g.devices}-{name}-{m}", steps=steps, warmup=warmup, device=device)
                    if "error" in run:
                        rows.append((g.label, g.devices, name, m, None, None, None, None, None, None, run["error"][:200]))
                        continue
                    pred, meas = run.get("iteration_ms_predicted"), run.get("iteration_ms_measured")
                    mem_errs = [_pct(r.get("peak_memory_bytes_predicted"), r.get("peak_memory_bytes_measured")) for r in run["ranks"]]
                    peaks_p = [r.get("peak_memory_bytes_predicted") or 0 for r in run["ranks"]]
                    peaks_m = [r.get("peak_memory_bytes_measured") or 0 for r in run["ranks"]]
                    rows.append((g.label, g.devices, name, m, pred, meas, _pct(pred, meas), max(peaks_p), max(peaks_m),
                                 _mape(mem_errs), None))
    time_mape = _mape([r[6] for r in rows])
    mem_mape = _mape([r[9] for r in rows])
    ok = sum(1 for r in rows if r[6] is not None)
    groups = {f"{g.label}/{g.devices}": None for g in grid}
    per_group = {k: (_mape([r[6] for r in rows if f"{r[0]}/{r[1]}" == k]), _mape([r[9] for r in rows if f"{r[0]}/{r[1]}" == k]))
                 for k in groups}
    notes = (
        f"{ok} of {len(rows)} runs completed; each trained {steps} steps ({warmup} warm-up) on {device}, "
        "measured_ms = median step time; predictions from the profile alone (no calibration).",
        f"MAPE step time: {'-' if time_mape is None else f'{time_mape:.1f}%'}; "
        f"MAPE peak memory (mean over ranks): {'-' if mem_mape is None else f'{mem_mape:.1f}%'}.",
        "MAPE by model/devices (time, memory): " + "; ".join(
            f"{k} {_fmt_pct(t)}, {_fmt_pct(m)}" for k, (t, m) in per_group.items()) + ".",
        "time_err_pct = 100 x (predicted - measured) / measured; mem_err_pct averages |error| over the ranks.",
        "Models: " + "; ".join(f"{lab} = {spec}" for lab, spec in dict((g.label + f"/{g.devices}", g.spec) for g in grid).items()),
    )
    return Table(
        name="fidelity",
        title="Fidelity: simulator prediction against the executor's measurement",
        columns=("model", "devices", "schedule", "microbatches", "predicted_ms", "measured_ms", "time_err_pct",
                 "predicted_peak_bytes", "measured_peak_bytes", "mem_abs_err_pct", "error"),
        rows=tuple(rows),
        notes=notes,
        summary={"mape_time_pct": time_mape, "mape_memory_pct": mem_mape, "runs": len(rows), "completed": ok,
                 "mape_by_group": {k: {"time_pct": t, "memory_pct": m} for k, (t, m) in per_group.items()}},
    )
