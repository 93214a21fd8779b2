"""`pplan bench quality`: pplan's plans against the uniform, params and time baselines.

Simulated (default): for every committed profile under profiles/ (or the given ones), every
device count and two memory settings (no limit, and a tight limit of 1.15x the least memory
any plan of the search can fit in), one `partition` search evaluates pplan and the three
baselines over the same schedules and micro-batch counts; the simulator judges them all. A
baseline's cell is its best simulated iteration time over that grid, as a ratio to pplan's
(above 1 = pplan faster), or empty when none of its plans fits the memory limit.

Measured (`--measured`): the same comparison on the executor, for gpt on 2 devices and the
synthetic (sleeping) model on 2 and 4, each plan trained for a few steps with `pplan run`'s
library call. Ratios are measured iteration time over pplan's measured time.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from planner.bench.table import Table
from planner.errors import InfeasibleError, PplanError

if TYPE_CHECKING:
    from planner.execute.runrecord import RunRecord

__all__ = ["bench_quality", "bench_quality_measured", "check_runs", "RUN_DEVICES", "find_profiles", "MEASURED_CONFIGS"]

BASELINES = ("uniform", "params", "time")
_COMPARED = ("dp",) + BASELINES  # the DP's own best plan, then the baselines
_TIGHT = 1.15
_REF = 2**40  # reference budget for the least-memory ratio

# (label, model spec, devices, global batch): small enough for a few seconds per run on 2 cores.
# The synthetic layers cost mostly per sample, so splitting the batch into micro-batches pays
# (as on a real device); layer 2 and 5 are slow and the first/last carry more parameters.
_SYN8 = ("synthetic:layers=8,fwd_ms=0.5,fwd_ms_per_sample=1/1/3/1/1/2/1/0.5,bwd_ms=1,"
         "bwd_ms_per_sample=2/2/6/2/2/4/2/1,param_bytes=4MB/1MB/1MB/1MB/1MB/1MB/1MB/8MB,act_bytes=256KB")
MEASURED_CONFIGS: tuple[tuple[str, str, int, int], ...] = (
    ("gpt", "gpt:layers=4,hidden=128,heads=4,seq=64,vocab=2048", 2, 16),
    ("synthetic", _SYN8, 2, 16),
    ("synthetic", _SYN8, 4, 16),
)


def find_profiles(folder: str | Path = "profiles") -> list[Path]:
    """Profile CSVs in `folder` (calibration files and hidden files left out), sorted."""
    d = Path(folder)
    return sorted(p for p in d.glob("*.csv") if not p.name.startswith("."))


def _label(prof: Any, path: Path | None) -> str:
    return path.name if path is not None else str(prof.meta.get("model") or "synthetic")


def _tight_memory(prof: Any, settings: Any, cal: Any) -> int | None:
    from planner.partition.api import resolve_devices
    from planner.partition.diagnose import least_memory_scale

    ref = replace(settings, memory_bytes=_REF)
    devices, links = resolve_devices(ref)
    lam = least_memory_scale(prof, ref, devices, links, [tuple(range(len(devices)))], cal)
    return None if not math.isfinite(lam) else int(math.ceil(_REF * lam * _TIGHT))


def _best(search: Any, method: str) -> Any:
    fits = [c for c in search.candidates if c.method == method and c.fits]
    return min(fits, key=lambda c: c.iteration_ms) if fits else None


def bench_quality(profiles: Sequence[str | Path] | None = None, devices: Sequence[int] = (2, 4, 8),
                  global_batch: int = 32, progress: Callable[[str], None] | None = None) -> Table:
    """Simulated comparison on committed profiles (synthetic stand-ins when there are none)."""
    from planner.calibration import find_calibration
    from planner.partition.search import PartitionSettings

    if global_batch < 1:
        raise PplanError(f"--global-batch must be at least 1, got {global_batch}")
    say = progress or (lambda _m: None)
    items, notes = _quality_profiles(profiles)
    rows = []
    for prof, path in items:
        cal = find_calibration(path) if path is not None else None
        for n in devices:
            if n > prof.n_layers:
                continue
            base = PartitionSettings(n_devices=n, memory_bytes=None, global_batch=global_batch)
            for mode in ("none", "tight"):
                label = _label(prof, path)
                say(f"quality: {label}, {n} devices, memory {mode}")
                mem = None if mode == "none" else _tight_memory(prof, base, cal)
                if mode == "tight" and mem is None:
                    continue
                rows.append(_quality_row(prof, replace(base, memory_bytes=mem), cal, label))
    summary_notes, geo, only_pplan = _quality_summary(rows, global_batch)
    cols = ["profile", "devices", "memory_limit_bytes", "pplan_ms", "pplan_choice"]
    for b in _COMPARED:
        cols += [f"{b}_x", f"{b}_fits"]
    return Table(name="quality", title="Plan quality: simulated iteration time of baselines relative to pplan",
                 columns=tuple(cols), rows=tuple(rows), notes=tuple(notes + summary_notes),
                 summary={"best_baseline_geomean_x": geo, "settings_only_pplan_fits": only_pplan})


def _quality_profiles(profiles: Sequence[str | Path] | None) -> tuple[list[tuple[Any, Path | None]], list[str]]:
    """(profile, its path or None) to compare on: the given ones, those under profiles/, or else
    synthetic stand-ins (with a note saying so)."""
    from planner.profiling.profile import load_profile

    paths = [Path(p) for p in profiles] if profiles else find_profiles()
    items: list[tuple[Any, Path | None]] = [(load_profile(p), p) for p in paths]
    if items:
        return items, []
    from planner.partition.synthetic import gpt_like, imbalanced

    return ([(gpt_like(24), None), (imbalanced(64), None)],
            ["profiles/ holds no profile: synthetic stand-ins (planner.partition.synthetic) were used."])


def _quality_row(prof: Any, settings: Any, cal: Any, label: str) -> tuple:
    """One table row: pplan's plan under `settings`, then (ratio to it, fits) per compared method."""
    from planner.partition.api import partition

    mem, n = settings.memory_bytes, settings.n_devices
    try:
        result = partition(prof, settings, cal)
    except InfeasibleError as e:
        return (label, n, mem, None, f"infeasible: {e.message[:60]}", *([None, False] * len(_COMPARED)))
    chosen = result.chosen
    cells: list[Any] = []
    for b in _COMPARED:
        best = _best(result.search, b)
        cells += [None if best is None else best.iteration_ms / chosen.iteration_ms, best is not None]
    return (label, n, mem, chosen.iteration_ms, f"{chosen.point.schedule} M={chosen.point.n_microbatches}", *cells)


def _quality_summary(rows: list[tuple], global_batch: int) -> tuple[list[str], float | None, int]:
    """(notes explaining the table, geometric mean of the best baseline's ratio, settings where
    only pplan fits)."""
    cells_of = range(1, len(_COMPARED))  # the baselines' cells follow the DP's
    ratios = [min(r[5 + 2 * k] for k in cells_of if r[5 + 2 * k] is not None)
              for r in rows if r[3] is not None and any(r[5 + 2 * k] is not None for k in cells_of)]
    only_pplan = sum(1 for r in rows if r[3] is not None and not any(r[6 + 2 * k] for k in cells_of))
    notes = [
        "x columns: that method's best simulated iteration time over the same schedules and micro-batch counts, "
        "divided by pplan's (above 1: pplan is faster); '-' with fits=no: none of its plans fits the memory limit.",
        "pplan (`--method auto`) keeps the fastest plan that fits among the DP's and the baselines' candidates, so no "
        "x is below 1; dp_x shows the DP's own plan alone (its objective is the bottleneck stage time, not the "
        "simulated iteration, so it can lose to a baseline the simulator prefers).",
        f"memory_limit_bytes: empty = unlimited; otherwise {_TIGHT}x the least memory any plan of the search fits in. "
        f"Global batch {global_batch}.",
    ]
    geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios)) if ratios else None
    if geo is not None:
        notes.append(f"Best baseline vs pplan, geometric mean over {len(ratios)} settings: {geo:.3f}x; "
                     f"settings where no baseline fits but pplan does: {only_pplan}.")
    return notes, geo, only_pplan


RUN_DEVICES = ("cpu", "cuda")
"""Where a bench's runs train."""


def check_runs(steps: int, warmup: int, device: str) -> None:
    """Refuse, before anything is profiled or trained, the settings the benches' runs would refuse
    only later, each run on its own (a --device typo became '0 of 2 runs completed', exit 0)."""
    from planner.execute.options import MAX_STEPS

    if device not in RUN_DEVICES:
        raise PplanError(f"--device {str(device)[:40]!r} is unknown", f"use {' or '.join(RUN_DEVICES)}")
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in (steps, warmup)) or not 0 <= warmup < steps <= MAX_STEPS:
        raise PplanError(f"--steps {steps!r} / --warmup {warmup!r}: need whole numbers with 0 <= warmup < steps <= {MAX_STEPS:,}",
                         "e.g. --steps 5 --warmup 2")


def bench_quality_measured(configs: Sequence[tuple[str, str, int, int]] = MEASURED_CONFIGS, steps: int = 5,
                           warmup: int = 2, device: str = "cpu",
                           progress: Callable[[str], None] | None = None) -> Table:
    """pplan's plan and each baseline's best plan, trained on the executor and timed (check_runs
    refuses the run settings first)."""
    check_runs(steps, warmup, device)
    from planner.bench.execution import candidate_plan, profile_to, run_measured
    from planner.partition.api import partition
    from planner.partition.search import PartitionSettings

    say = progress or (lambda _m: None)
    rows = []
    with tempfile.TemporaryDirectory(prefix="pplan-bench-") as tmp:
        work = Path(tmp)
        for k, (label, spec, n, batch) in enumerate(configs):
            prof = profile_to(spec, sorted({batch // m for m in range(1, batch + 1) if batch % m == 0}), work, say)
            result = partition(prof, PartitionSettings(n_devices=n, memory_bytes=None, global_batch=batch))
            plans = [("pplan", result.plan)]
            for b in BASELINES:
                best = _best(result.search, b)
                if best is not None:
                    plans.append((b, candidate_plan(result.plan, best)))
            seen: dict[tuple, RunRecord | str] = {}
            measured: dict[str, RunRecord | str] = {}
            for method, plan in plans:
                key = (plan.schedule, plan.n_microbatches, tuple(st.layers for st in plan.stages),
                       tuple(st.recompute for st in plan.stages))
                if key not in seen:
                    say(f"quality --measured: {label} on {n} devices, {method} plan ({plan.schedule}, M={plan.n_microbatches})")
                    seen[key] = run_measured(plan, work, f"q{k}-{method}", steps=steps, warmup=warmup, device=device)
                measured[method] = seen[key]
            ref = _measured_ms(measured["pplan"])
            for method, plan in plans:
                run = measured[method]
                meas = _measured_ms(run)
                peaks = [r.peak_memory_bytes_measured for r in run.ranks] if not isinstance(run, str) else []
                rows.append((label, n, method, plan.schedule, plan.n_microbatches,
                             "/".join(str(st.layers[1] - st.layers[0]) for st in plan.stages),
                             plan.predicted.iteration_ms if plan.predicted else None, meas,
                             (meas / ref) if meas and ref else None,
                             max((p for p in peaks if p is not None), default=None), run if isinstance(run, str) else None))
    return Table(
        name="quality_measured",
        title="Plan quality, measured: iteration time of each plan trained on the executor",
        columns=("model", "devices", "method", "schedule", "microbatches", "layers_per_stage", "predicted_ms",
                 "measured_ms", "measured_x_vs_pplan", "peak_memory_bytes_measured", "error"),
        rows=tuple(rows),
        notes=(
            f"Each plan trained {steps} steps ({warmup} warm-up) on {device}; measured_ms is the median step time.",
            "A baseline row is that method's best simulated plan over all schedules and micro-batch counts "
            "(no memory limit); identical plans are run once.",
            "Models: " + "; ".join(f"{lab} = {spec}" for lab, spec in dict((c[0], c[1]) for c in configs).items()),
        ),
    )


def _measured_ms(run: RunRecord | str) -> float | None:
    """A run's measured step time; None for a run that failed (its one-line reason instead)."""
    return None if isinstance(run, str) else run.iteration_ms_measured
