"""What-if sweeps: simulate one plan over several micro-batch counts or schedules.

`--sweep microbatches=1,2,4,8` keeps the micro-batch size (so the global batch grows with the
count); `--sweep schedule=gpipe,1f1b,zb` keeps everything else. A value the schedule cannot run
(e.g. 1f1b with fewer micro-batches than devices) becomes a row with its reason instead of
stopping the sweep.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from planner.calibration import Calibration
from planner.errors import PplanError
from planner.plan import Plan
from planner.profiling.profile import Profile
from planner.schedules import SCHEDULE_NAMES

__all__ = ["SweepRow", "parse_sweep", "run_sweep", "sweep_figure"]

@dataclass(frozen=True)
class SweepRow:
    """One value of a sweep and what the simulator predicts for it."""

    value: Any
    """The parameter's value (an int micro-batch count or a schedule name)."""
    iteration_ms: float | None
    """Predicted iteration time, ms (None when the value cannot run)."""
    bubble_fraction: float | None
    """Predicted bubble fraction."""
    throughput_samples_per_s: float | None
    """Predicted throughput."""
    peak_memory_bytes: float | None
    """Largest device peak, bytes."""
    fits: bool | None
    """All devices within their memory limits."""
    error: str | None = None
    """Why the value cannot run."""

    def as_dict(self) -> dict[str, Any]:
        return {"value": self.value, "iteration_ms": self.iteration_ms, "bubble_fraction": self.bubble_fraction,
                "throughput_samples_per_s": self.throughput_samples_per_s,
                "peak_memory_bytes": None if self.peak_memory_bytes is None else int(self.peak_memory_bytes),
                "fits": self.fits, "error": self.error}


def parse_sweep(text: str) -> tuple[str, list[Any]]:
    """'microbatches=1,2,4' -> ('microbatches', [1, 2, 4]); 'schedule=gpipe,zb' -> names."""
    name, sep, values = text.partition("=")
    name = name.strip().replace("-", "_").lower()
    aliases = {"microbatches": "microbatches", "n_microbatches": "microbatches", "m": "microbatches", "schedule": "schedule"}
    if not sep or name not in aliases:
        raise PplanError(f"cannot read --sweep {text!r}", "write --sweep microbatches=1,2,4,8 or --sweep schedule=gpipe,1f1b,zb")
    name = aliases[name]
    items = [v.strip() for v in values.split(",") if v.strip()]
    if not items:
        raise PplanError(f"--sweep {text!r} has no values", "list them after '=' separated by commas")
    if len(set(items)) != len(items):
        raise PplanError(f"--sweep {text!r} repeats a value")
    if name == "schedule":
        bad = [v for v in items if v not in SCHEDULE_NAMES]
        if bad:
            raise PplanError(f"--sweep schedule: unknown schedule {bad[0]!r}", f"use {', '.join(SCHEDULE_NAMES)}")
        return name, items
    try:
        counts = [int(v) for v in items]
    except ValueError:
        raise PplanError(f"--sweep {text!r}: micro-batch counts must be integers", "write e.g. microbatches=1,2,4,8") from None
    if any(c < 1 or c > 1_000_000 for c in counts):
        raise PplanError(f"--sweep {text!r}: micro-batch counts must be between 1 and 1000000")
    return name, counts


def run_sweep(plan: Plan, profile: Profile, parameter: str, values: list[Any],
              calibration: Calibration | None = None) -> list[SweepRow]:
    """Simulate `plan` once per value of `parameter` (see module docstring)."""
    from planner.simulate import simulate

    rows = []
    for value in values:
        variant = plan.with_(n_microbatches=value) if parameter == "microbatches" else plan.with_(schedule=value)
        try:
            variant.validate(profile.n_layers)
            r = simulate(variant, profile, calibration=calibration, record_timeline=False)
        except PplanError as e:
            rows.append(SweepRow(value, None, None, None, None, None, e.one_line()))
            continue
        rows.append(SweepRow(value, r.iteration_ms, r.bubble_fraction, r.throughput_samples_per_s,
                             max(r.peak_memory_bytes), r.fits))
    return rows


def sweep_figure(parameter: str, rows: list[SweepRow], title: str) -> Any:
    """Iteration time and bubble fraction per value (matplotlib Figure, imported lazily)."""
    from planner.report.style import new_figure, style_context

    ok = [r for r in rows if r.iteration_ms is not None]
    with style_context():
        fig = new_figure(8.5, 4.4)
        ax = fig.subplots()
        labels = [str(r.value) for r in ok]
        x = list(range(len(ok)))
        if parameter == "microbatches":
            ax.plot(x, [r.iteration_ms for r in ok], marker="o", color="#4C72B0", label="iteration time")
        else:
            ax.bar(x, [r.iteration_ms for r in ok], color="#4C72B0", width=0.6, label="iteration time")
        ax.set_xticks(x, labels)
        ax.set_xlabel("micro-batches per iteration" if parameter == "microbatches" else "schedule")
        ax.set_ylabel("iteration time (ms)")
        ax.set_ylim(bottom=0)
        ax2 = ax.twinx()
        ax2.plot(x, [100 * r.bubble_fraction for r in ok], marker="s", ls="--", color="#DD8452", label="bubble")
        ax2.set_ylabel("bubble (% of device time)")
        ax2.set_ylim(0, 100)
        ax2.grid(False)
        h1, l1 = ax.get_legend_handles_labels()
        h2, l2 = ax2.get_legend_handles_labels()
        fig.legend(h1 + h2, l1 + l2, loc="outside lower center", ncols=2)
        fig.suptitle(title)
    return fig
