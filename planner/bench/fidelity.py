"""`pplan bench fidelity`: predicted against measured step time and peak memory.

For each model, device count, schedule and micro-batch count of the grid, `partition` makes
the plan with that schedule and count forced (the plan the user would get), the simulator
predicts it from the profile just measured (no calibration), and the executor trains it for a
few steps. Errors are 100 x (predicted - measured) / measured; the mean absolute percentage
error (MAPE) is over the runs that completed. Peak memory compares each rank's predicted peak
with the executor's measure, the allocator's peak (CUDA's caching allocator on GPU; on CPU
torch's allocator as torch.profiler counts it: docs/executor.md), and averages the ranks;
mem_worst_err_pct is the rank missed most.

With `repeats` > 1 each case runs that many times: measured_ms is the median of the runs' medians,
and the row adds the fastest and slowest run and the spread of the error (max - min, points).

Profiles of real models on CPU are measured with `co_run = devices - 1` (when the ranks fit the
cores): that many processes train the model beside the profiler, as the run's other ranks will,
so memory-bound layers are timed under the memory-bandwidth sharing they meet in the run
(planner.profiling.corun). The synthetic model sleeps instead of computing: no co-run. Column
`co_run` says what each profile used.

`calibrated=True` (`--calibrated`, with repeats >= 2) also measures per-plan calibration as a
user gets it from `pplan run --calibrate`: each case's first run fits a calibration (beside a copy
of the profile for that case alone), and every following run is predicted with it;
cal_time_err_pct is the median of those runs' errors (the first run's prediction, from the bare
profile, still gives time_err_pct, and compute_ratio comes from that run alone).

`fidelity_figure(table, path, machine)` draws predicted against measured step time on log axes with
the y = x line and ±10% bands, one point per case (matplotlib, imported there);
`redraw_fidelity_figure(csv, png)` draws it again from a written CSV.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from planner.bench.table import Table, machine_line
from planner.errors import PplanError
from planner.hostinfo import usable_cores
from planner.schedules.registry import SCHEDULE_NAMES

__all__ = ["FidelityPoint", "DEFAULT_GRID", "QUICK_GRID", "TERMINAL_COLUMNS", "bench_fidelity", "calibrated_error",
           "fidelity_figure", "redraw_fidelity_figure", "select_grid"]

_SYN16 = ("synthetic:layers=16,fwd_ms=3/5/3/4/6/3/4/5/3/4/5/3/6/4/3/5,bwd_ms=6/10/6/8/12/6/8/10/6/8/10/6/12/8/6/10,"
          "param_bytes=2MB,act_bytes=1MB")
# realistic sizes (steps of tenths of a second to seconds): on smaller ones the per-action and
# hand-over costs that no layer profile sees dominate, and `run` says so instead
_GPT = "gpt:layers=4,hidden=256,heads=4,seq=128,vocab=8192"
_MLP = "mlp:layers=6,hidden=2048"
_RESNET = "resnet:stages=3,blocks=1,width=16,image=32"
_HF_GPT2 = "hf:gpt2:n_layer=4,n_embd=256,n_head=4,vocab_size=8192"
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
    input_shape: tuple[int, ...] | None = None
    """One sample's shape for models that need it (`hf:`: tokens per sample)."""


DEFAULT_GRID: tuple[FidelityPoint, ...] = (
    FidelityPoint("synthetic", _SYN16, 4, _ALL, (4, 8)),
    FidelityPoint("synthetic", _SYN16, 8, _ALL, (8,)),
    FidelityPoint("gpt", _GPT, 2, _ALL, (4,), micro_batch_size=32),
    FidelityPoint("mlp", _MLP, 2, _ALL, (4,), micro_batch_size=32),
    FidelityPoint("resnet", _RESNET, 2, ("gpipe", "1f1b"), (4,), micro_batch_size=32),
    FidelityPoint("hf-gpt2", _HF_GPT2, 2, _ALL, (4,), micro_batch_size=16, input_shape=(128,)),
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


def _median_abs(values: list[float | None]) -> float | None:
    vals = [abs(v) for v in values if v is not None]
    return statistics.median(vals) if vals else None


def _fmt_pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}%"


def co_run_for(g: FidelityPoint, device: str, cores: int) -> int:
    """Background processes to profile `g` beside: its other ranks, where they share this CPU
    (every rank gets cores // devices threads, so devices <= cores ranks fit); else 0."""
    from planner.models.spec import parse_spec

    if device != "cpu" or parse_spec(g.spec)[0] == "synthetic" or g.devices > cores:
        return 0  # GPUs have their own memory; sleeping layers share nothing
    return g.devices - 1


def select_grid(models: str | None, grid: Sequence[FidelityPoint] = DEFAULT_GRID) -> tuple[FidelityPoint, ...]:
    """The groups of `grid` whose label is in the comma list `models` (None or empty: all), in grid order."""
    if not models:
        return tuple(grid)
    from planner.jsonio import nearest

    labels = list(dict.fromkeys(g.label for g in grid))
    wanted = [m.strip() for m in models.split(",") if m.strip()]
    for m in wanted:
        if m not in labels:
            close = nearest(m, labels)
            raise PplanError(f"--models {m!r} is not a model of the fidelity grid",
                             (f"did you mean {close!r}? " if close else "") + f"choose from {', '.join(labels)}")
    return tuple(g for g in grid if g.label in wanted)


def bench_fidelity(grid: Sequence[FidelityPoint] = DEFAULT_GRID, steps: int = 5, warmup: int = 2,
                   device: str = "cpu", progress: Callable[[str], None] | None = None, repeats: int = 1,
                   calibrated: bool = False) -> Table:
    """Run every grid point on the executor and compare with the simulator's prediction."""
    from planner.bench.execution import profile_to
    from planner.bench.quality import check_runs
    from planner.bench.simulator_bench import check_repeats

    check_runs(steps, warmup, device)
    check_repeats(repeats)
    if calibrated and repeats < 2:
        raise PplanError(f"--calibrated with --repeats {repeats}: the first run of a case calibrates and the "
                         "following ones are predicted with it", "e.g. --calibrated --repeats 4 (3 calibrated runs)")
    say = progress or (lambda _m: None)
    total = sum(len(g.schedules) * len(g.microbatches) for g in grid)
    rows: list[tuple[Any, ...]] = []
    done = 0
    with tempfile.TemporaryDirectory(prefix="pplan-bench-") as tmp:
        work = Path(tmp)
        for g in grid:
            co_run = co_run_for(g, device, usable_cores())
            try:
                # as `pplan profile` measures by default: the prediction is only as good as the profile
                prof = profile_to(g.spec, [g.micro_batch_size], work, say, device=device, input_shape=g.input_shape,
                                  warmup=3, repeats=15, threads=max(1, usable_cores() // g.devices), co_run=co_run)
            except PplanError as e:  # e.g. transformers not installed: that model's rows say so
                prof, why = None, f"not profiled: {e.one_line()[:120]}"
            for name in g.schedules:
                for m in g.microbatches:
                    done += 1
                    if prof is None:
                        rows.append((g.label, g.devices, name, m) + (None,) * 6 + (why, None, None, None, 0) + _NO_RUN
                                    + (co_run, None, None, None))
                        continue
                    say(f"fidelity {done}/{total}: {g.label} on {g.devices} devices, {name}, M={m}")
                    row, cal = _fidelity_row(g, name, m, prof, work, steps=steps, warmup=warmup, device=device,
                                             repeats=repeats, calibrated=calibrated)
                    rows.append(row + (co_run,) + cal)
    notes, summary = _fidelity_summary(rows, grid, steps=steps, warmup=warmup, device=device, repeats=repeats,
                                       calibrated=calibrated)
    return Table(
        name="fidelity",
        title="Fidelity: simulator prediction against the executor's measurement",
        columns=COLUMNS,
        rows=tuple(rows),
        notes=notes,
        summary=summary,
        terminal_columns=TERMINAL_COLUMNS,
    )


COLUMNS = ("model", "devices", "schedule", "microbatches", "predicted_ms", "measured_ms", "time_err_pct",
           "predicted_peak_bytes", "measured_peak_bytes", "mem_abs_err_pct", "error", "measured_ms_min", "measured_ms_max",
           "err_spread_pct", "repeats", "compute_ratio", "compute_ratio_cpu", "rss_growth_peak_bytes", "load_average",
           "basis", "co_run", "cal_time_err_pct", "cal_runs", "mem_worst_err_pct")
TERMINAL_COLUMNS = ("model", "devices", "schedule", "microbatches", "predicted_ms", "measured_ms", "time_err_pct",
                    "mem_abs_err_pct", "err_spread_pct", "error")
"""What `pplan bench fidelity` prints (the CSV, Markdown and --json keep all COLUMNS): the rest ran to 411 characters."""


def _case_profile(prof: Any, work: Path, case: str) -> Any:
    """A copy of the profile for one case alone: the calibration its first run writes beside it
    (planner.calibration.calibration_path_for) must not reach the other cases' predictions."""
    from planner.profiling.profile import load_profile

    folder = work / case
    folder.mkdir(exist_ok=True)
    shutil.copyfile(prof.path, folder / "profile.csv")
    return load_profile(folder / "profile.csv")


def _fidelity_row(g: FidelityPoint, name: str, m: int, prof: Any, work: Path, *, steps: int, warmup: int,
                  device: str, repeats: int, calibrated: bool = False) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """Plan `g` under schedule `name` with `m` micro-batches, run it `repeats` times, and compare:
    one table row (with the error, and no numbers, when it cannot be planned or run), and
    (cal_time_err_pct, cal_runs) with `calibrated` (module docstring), else (None, None)."""
    from planner.bench.execution import run_measured
    from planner.partition.api import partition
    from planner.partition.search import PartitionSettings

    case = f"f-{g.label}-{g.devices}-{name}-{m}"
    settings = PartitionSettings(n_devices=g.devices, memory_bytes=None, global_batch=m * g.micro_batch_size,
                                 microbatches=m, schedule=name)
    try:
        plan = partition(_case_profile(prof, work, case) if calibrated else prof, settings).plan
    except PplanError as e:
        return (g.label, g.devices, name, m, None, None, None, None, None, None, f"not planned: {e.one_line()[:120]}",
                None, None, None, 0) + _NO_RUN, (None, None, None)
    runs = [run_measured(plan, work, f"{case}-{k}", steps=steps, warmup=warmup, device=device,
                         calibrate=calibrated and k == 0) for k in range(repeats)]
    failed = [r for r in runs if isinstance(r, str)]
    if failed:
        return (g.label, g.devices, name, m, None, None, None, None, None, None, failed[0][:200],
                None, None, None, len(runs) - len(failed)) + _NO_RUN, (None, None, None)
    done = [r for r in runs if not isinstance(r, str)]
    meds = [r.iteration_ms_measured for r in done if r.iteration_ms_measured]
    run = done[0]
    bare = done[:1] if calibrated else done  # the ratios of measured to the profile's own times, no calibration
    pred, meas = run.iteration_ms_predicted, (statistics.median(meds) if meds else None)
    errs = [e for e in (_pct(pred, x) for x in meds) if e is not None]
    mem_errs = [_pct(r.peak_memory_bytes_predicted, r.peak_memory_bytes_measured) for r in run.ranks]
    mem_errs_signed = [e for e in mem_errs if e is not None]
    peaks_p = [r.peak_memory_bytes_predicted or 0 for r in run.ranks]
    peaks_m = [r.peak_memory_bytes_measured or 0 for r in run.ranks]
    rss = [r.peak_memory_bytes_rss for r in run.ranks if r.peak_memory_bytes_rss is not None]
    later = [(r.iteration_ms_predicted, r.iteration_ms_measured, r.prediction_source) for r in done[1:]]
    return (g.label, g.devices, name, m, pred, meas, _pct(pred, meas), max(peaks_p), max(peaks_m),
            _mape(mem_errs), None, min(meds) if meds else None, max(meds) if meds else None,
            (max(errs) - min(errs)) if errs else None, len(runs), _median_of([r.compute_ratio for r in bare]),
            _median_of([r.compute_ratio_cpu for r in bare]), max(rss) if rss else None,
            _median_of([r.load_average for r in done]), run.prediction_source), \
        ((calibrated_error(later) if calibrated else (None, None)) + (_worst(mem_errs_signed),))


def calibrated_error(runs: list[tuple[float | None, float | None, str | None]]) -> tuple[float | None, int]:
    """(median error %, runs counted) over (predicted ms, measured ms, prediction source) of the
    runs after a case's first: only those predicted with the first run's calibration count (a run
    that did not predict from one, because none was written, does not)."""
    errs = [_pct(pred, meas) for pred, meas, source in runs if "calibration" in str(source)]
    errs = [e for e in errs if e is not None]
    return (statistics.median(errs) if errs else None), len(errs)


_NO_RUN = (None, None, None, None, None)


def _fmt_signed(v: float | None) -> str:
    return "-" if v is None else f"{v:+.1f}%"


def _worst(errors: list[float]) -> float | None:
    """The error of largest magnitude, sign kept (the rank the memory model misses most)."""
    return max(errors, key=abs) if errors else None


def _median_of(values: list[float | None]) -> float | None:
    vals = [v for v in values if isinstance(v, (int, float))]
    return statistics.median(vals) if vals else None


def _fidelity_summary(rows: list[tuple[Any, ...]], grid: Sequence[FidelityPoint], *, steps: int, warmup: int,
                      device: str, repeats: int, calibrated: bool = False) -> tuple[tuple[str, ...], dict[str, Any]]:
    """(the table's notes, its summary): errors over all rows and per model/devices group."""
    time_mape = _mape([r[6] for r in rows])
    mem_mape = _mape([r[9] for r in rows])
    ok = sum(1 for r in rows if r[6] is not None)
    groups = {f"{g.label}/{g.devices}": None for g in grid}
    per_group = {k: (_mape([r[6] for r in rows if f"{r[0]}/{r[1]}" == k]), _mape([r[9] for r in rows if f"{r[0]}/{r[1]}" == k]))
                 for k in groups}
    median_group = {k: _median_abs([r[6] for r in rows if f"{r[0]}/{r[1]}" == k]) for k in groups}
    bases = sorted({str(r[19]) for r in rows if r[19]})
    co_runs = {f"{r[0]}/{r[1]}": r[20] for r in rows}
    cal_group = {k: _median_abs([r[21] for r in rows if f"{r[0]}/{r[1]}" == k]) for k in groups}
    notes = (
        f"{ok} of {len(rows)} runs completed; each trained {steps} steps ({warmup} warm-up) on {device}, "
        f"measured_ms = median step time; predicted by {', '.join(bases) or '-'} (no per-plan calibration).",
        "Profiled beside co_run processes training the same model (the runs' other ranks on this CPU; 0: alone): "
        + "; ".join(f"{k} {v}" for k, v in co_runs.items()) + ".",
        "Median |time error| by model/devices: " + "; ".join(f"{k} {_fmt_pct(v)}" for k, v in median_group.items()) + ".",
        "compute_ratio = median over actions of measured / profiled time; compute_ratio_cpu the same with the "
        "actions' CPU time (near 1 while compute_ratio is not: the ranks waited for CPUs); rss_growth_peak_bytes = "
        "the largest rank's RSS growth over a step (the allocator's slack and the C library's kept memory too); "
        "measured_peak_bytes is the allocator's peak (torch's own count, independent of the prediction).",
        f"MAPE step time: {'-' if time_mape is None else f'{time_mape:.1f}%'}; "
        f"MAPE peak memory (mean over ranks): {'-' if mem_mape is None else f'{mem_mape:.1f}%'}.",
        "MAPE by model/devices (time, memory): " + "; ".join(
            f"{k} {_fmt_pct(t)}, {_fmt_pct(m)}" for k, (t, m) in per_group.items()) + ".",
        "time_err_pct = 100 x (predicted - measured) / measured; mem_abs_err_pct averages |error| over the ranks; "
        "mem_worst_err_pct is the rank with the largest |error|, sign kept. Worst rank by model/devices: "
        + "; ".join(f"{k} {_fmt_signed(_worst([r[23] for r in rows if f'{r[0]}/{r[1]}' == k and r[23] is not None]))}"
                    for k in groups) + ".",
        f"Each case ran {repeats} time(s): measured_ms is the median of the runs' medians; err_spread_pct = max - min "
        "of the runs' errors (points).",
        "Models: " + "; ".join(f"{lab} = {spec}" for lab, spec in dict((g.label + f"/{g.devices}", g.spec) for g in grid).items()),
    )
    if calibrated:
        notes += ("With per-plan calibration (the first run of each case calibrates, the other "
                  f"{repeats - 1} are predicted with it), median |time error| by model/devices: "
                  + "; ".join(f"{k} {_fmt_pct(v)}" for k, v in cal_group.items()) + ".",)
    summary = {"mape_time_pct": time_mape, "mape_memory_pct": mem_mape, "runs": len(rows), "completed": ok,
               "mape_by_group": {k: {"time_pct": t, "memory_pct": m} for k, (t, m) in per_group.items()},
               "median_abs_time_pct_by_group": median_group, "co_run_by_group": co_runs}
    if calibrated:
        summary["calibrated_median_abs_time_pct_by_group"] = cal_group
    return notes, summary


def fidelity_figure(table: Table, path: str, machine: dict[str, Any] | None = None) -> None:
    """Predicted against measured step time, log axes, y = x and ±10% bands, one point per case,
    its bar the fastest to slowest run; under it what the bars are and `machine` (None: this one)."""
    from planner.atomic import atomic_write_bytes
    from planner.report.style import device_color, new_figure, render, style_context

    pts = [p for p in (dict(zip(table.columns, r)) for r in table.rows) if p.get("predicted_ms") and p.get("measured_ms")]
    with style_context():
        fig = new_figure(6.0, 6.0)
        ax = fig.add_subplot(1, 1, 1)
        if pts:
            lo = min(min(p["predicted_ms"], p["measured_ms"]) for p in pts) / 1.5
            hi = max(max(p["predicted_ms"], p["measured_ms"]) for p in pts) * 1.5
            xs = [lo, hi]
            ax.fill_between(xs, [x * 0.9 for x in xs], [x * 1.1 for x in xs], color="0.88", lw=0, label="±10% of measured")
            ax.plot(xs, xs, color="0.3", lw=1, label="predicted = measured")
            for i, label in enumerate(sorted({p["model"] for p in pts})):
                mine = [p for p in pts if p["model"] == label]
                ax.errorbar([p["measured_ms"] for p in mine], [p["predicted_ms"] for p in mine],
                            xerr=[[p["measured_ms"] - (p.get("measured_ms_min") or p["measured_ms"]) for p in mine],
                                  [(p.get("measured_ms_max") or p["measured_ms"]) - p["measured_ms"] for p in mine]],
                            fmt="o", ms=4.5, capsize=2, color=device_color(i), label=label)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlim(lo, hi)
            ax.set_ylim(lo, hi)
            for axis in (ax.xaxis, ax.yaxis):
                _plain_log_ticks(axis, lo, hi)
        ax.set_xlabel("measured step time (ms)")
        ax.set_ylabel("predicted step time (ms)")
        ax.set_title("pplan: predicted vs measured step time")
        ax.legend(loc="upper left")
        fig.supxlabel(_figure_footnote(pts, machine if machine is not None else _this_machine()),
                      fontsize=7.5, color="#444444", x=0.02, ha="left", multialignment="left")
        atomic_write_bytes(path, render(fig, "png", dpi=120))  # never a half-written figure


def _this_machine() -> dict[str, Any]:
    from planner.bench.machine import machine_info

    return machine_info()


def _plain_log_ticks(axis: Any, lo: float, hi: float) -> None:
    """Ticks at 1-2-5 of each decade (every integer of it under one decade), written as plain
    numbers (200, 1,000): log axes label only powers of ten otherwise."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0) if hi / lo >= 10 else tuple(range(1, 10))))
    axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,.0f}" if v >= 1 else f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def _figure_footnote(pts: list[dict[str, Any]], machine: dict[str, Any]) -> str:
    """What the error bars are (the table's measured_ms_min/max) and where the runs were measured."""
    runs = sorted({p["repeats"] for p in pts if isinstance(p.get("repeats"), int) and p["repeats"] > 1})
    if runs:
        count = f"{runs[0]}" if len(runs) == 1 else f"{runs[0]}-{runs[-1]}"
        bars = (f"Each point is the median of {count} runs of one case; its bar spans the fastest to the slowest run "
                "(min-max of measured step time).")
    else:
        bars = "One run per case: no bars."
    # the machine as the Markdown's first line has it; wrapped: constrained layout does not wrap text
    return "\n".join(textwrap.wrap(bars, 100, break_on_hyphens=False) + textwrap.wrap(machine_line(machine), 100))


def redraw_fidelity_figure(csv_path: str, png_path: str) -> None:
    """Draw the figure again from the CSV a fidelity bench wrote, with the machine its header
    records: the look changes without rerunning the bench (22 minutes for reports/bench)."""
    from planner.bench.table import read_table_csv

    table, machine = read_table_csv(csv_path, "fidelity", "")
    fidelity_figure(table, png_path, machine)
