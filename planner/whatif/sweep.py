"""Sweeps of a plan: one simulation per micro-batch count or schedule, one row each.

`pplan simulate --sweep` and the report's sweep figure call this module; it sits above the simulator and
below the figures (they draw its rows), and imports neither torch nor matplotlib. A swept micro-batch count
is split as `planner.whatif.change.split_batch` splits `--microbatches` (the global batch kept by default). A
value a schedule or the batch cannot take (e.g. 1f1b with fewer micro-batches than devices, or M not dividing
the global batch) becomes a row with its reason instead of stopping the sweep; only a sweep none of whose
values can run is refused (`sweep_refusal`), naming each value with its reason.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Iterable, Sequence

from planner.calibration import Calibration
from planner.cost.held import wgrad_unmeasured_note
from planner.errors import PplanError
from planner.hardware import Hardware
from planner.jsonio import nearest
from planner.limits import MAX_SIMULATED_ACTIONS, MAX_SWEEP_VALUES
from planner.plan import Plan
from planner.profiling.profile import Profile
from planner.schedules.registry import get_schedule, schedule_name
from planner.whatif.change import split_batch

__all__ = ["SweepRow", "MOST_NAMED", "parse_sweep", "run_sweep", "check_sweep_actions", "sweep_grid", "sweep_to_dict",
           "failed_values", "skipped_note", "sweep_refusal"]

MOST_NAMED = 8  # values named with their reasons in one line; the rest are counted (100 reasons are no message)


@dataclass(frozen=True)
class SweepRow:
    """One value of a sweep and what the simulator predicts for it."""

    value: Any
    """The parameter's value (an int micro-batch count or a schedule name)."""
    schedule: str
    """Schedule simulated."""
    n_microbatches: int
    """Micro-batches per iteration."""
    micro_batch_size: int | None
    """Samples per micro-batch (None when the count cannot split the batch)."""
    global_batch: int | None
    """Samples per iteration over every data-parallel replica (dp x n_microbatches x micro_batch_size; None with the size)."""
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
    interpolated: bool = False
    """The micro-batch size was not profiled; costs are interpolated."""
    memory_unpriced: bool = False
    """The profile cannot price all this schedule holds (zero-bubble or interleaved without a
    wgrad_bytes column, planner.cost.held): peak memory and `fits` are a lower bound ("yes?")."""
    hint: str | None = None
    """The end of `error` that says what to change (a list of many values gives each hint once); not in the JSON."""

    @property
    def reason(self) -> str | None:
        """`error` without its hint: why the value cannot run."""
        if self.error is None or not self.hint or not self.error.endswith(f"; {self.hint}"):
            return self.error
        return self.error[: -len(self.hint) - 2]

    def as_dict(self) -> dict[str, Any]:
        """Its fields as JSON values, in field order (peak memory as whole bytes; the hint is in `error`)."""
        peak = None if self.peak_memory_bytes is None else int(self.peak_memory_bytes)
        fields = {**asdict(self), "peak_memory_bytes": peak}
        del fields["hint"]
        return fields


def parse_sweep(text: str) -> tuple[str, list[Any]]:
    """'microbatches=1,2,4' -> ('microbatches', [1, 2, 4]); 'schedule=gpipe,zb' -> names."""
    name, sep, values = text.partition("=")
    name = name.strip().replace("-", "_").lower()
    aliases = {"microbatches": "microbatches", "n_microbatches": "microbatches", "m": "microbatches", "schedule": "schedule"}
    if not sep or name not in aliases:
        guess = nearest(name, ("microbatches", "schedule")) if sep and name else None
        usage = "--sweep microbatches=1,2,4,8 or --sweep schedule=gpipe,1f1b,zb"
        raise PplanError(f"cannot read --sweep {text!r}" + (f": unknown parameter {name!r}" if sep else ""),
                         f"did you mean {guess!r}? write {usage}" if guess else f"write {usage}")
    name = aliases[name]
    items = [v.strip() for v in values.split(",") if v.strip()]
    if not items:
        raise PplanError(f"--sweep {text!r} has no values", "list them after '=' separated by commas")
    if len(items) > MAX_SWEEP_VALUES:  # each value is one simulation
        raise PplanError(f"--sweep {name} lists {len(items):,} values, more than {MAX_SWEEP_VALUES}",
                         "sweep fewer values, e.g. powers of two: microbatches=1,2,4,8,16,32")
    if len(set(items)) != len(items):
        raise PplanError(f"--sweep {text!r} repeats a value", "list each value once")
    if name == "schedule":
        names = [schedule_name(v, "--sweep schedule") for v in items]
        if len(set(names)) != len(names):
            raise PplanError(f"--sweep {text!r} repeats a schedule", "list each schedule once (zb and ZB are one)")
        return name, names
    try:
        counts = [int(v) for v in items]
    except ValueError:
        raise PplanError(f"--sweep {text!r}: micro-batch counts must be integers", "write e.g. microbatches=1,2,4,8") from None
    if any(c < 1 or c > 1_000_000 for c in counts):
        raise PplanError(f"--sweep {text!r}: micro-batch counts must be between 1 and 1000000", "write e.g. microbatches=1,2,4,8")
    return name, counts


def _row(value: Any, variant: Plan, profile: Profile, calibration: Calibration | None,
         hardware: Hardware | None = None) -> SweepRow:
    """Simulate one variant; a variant that cannot run becomes a row with its reason."""
    from planner.simulate import simulate

    base = dict(value=value, schedule=variant.schedule, n_microbatches=variant.n_microbatches,
                micro_batch_size=variant.micro_batch_size, global_batch=variant.global_batch)
    try:
        variant.validate(profile.n_layers)
        r = simulate(variant, profile, calibration=calibration, record_timeline=False, hardware=hardware)
    except PplanError as e:
        return SweepRow(**base, iteration_ms=None, bubble_fraction=None, throughput_samples_per_s=None,
                        peak_memory_bytes=None, fits=None, error=e.one_line(), hint=_hint(e))
    spec = get_schedule(variant.schedule)
    unpriced = wgrad_unmeasured_note(profile.at(variant.micro_batch_size), spec.split_backward, spec.holds_sends) is not None
    return SweepRow(**base, iteration_ms=r.iteration_ms, bubble_fraction=r.bubble_fraction,
                    throughput_samples_per_s=r.throughput_samples_per_s, peak_memory_bytes=max(r.peak_memory_bytes),
                    fits=r.fits, interpolated=bool(r.interpolated), memory_unpriced=unpriced)


def _hint(e: PplanError) -> str | None:
    """The error's hint as its one line ends with it (whitespace folded)."""
    return " ".join(e.hint.split()) if e.hint else None


def run_sweep(plan: Plan, profile: Profile, parameter: str, values: list[Any],
              calibration: Calibration | None = None, keep: str = "global-batch",
              hardware: Hardware | None = None) -> list[SweepRow]:
    """Simulate `plan` once per value of `parameter` (see the module docstring)."""
    if parameter not in ("microbatches", "schedule"):
        raise PplanError(f"cannot sweep {parameter!r}", "sweep microbatches or schedule")
    rows = []
    for value in values:
        m, b = (value, None) if parameter == "microbatches" else (plan.n_microbatches, plan.micro_batch_size)
        try:
            if parameter == "microbatches":
                m, b = split_batch(plan, value, None, keep)
                variant = plan.with_(n_microbatches=m, micro_batch_size=b)
            else:
                variant = plan.with_(schedule=value)
        except PplanError as e:
            rows.append(SweepRow(value, value if parameter == "schedule" else plan.schedule, m, b,
                                 None if b is None else plan.dp * m * b,
                                 None, None, None, None, None, e.one_line(), hint=_hint(e)))
            continue
        rows.append(_row(value, variant, profile, calibration, hardware))
    return rows


def failed_values(parameter: str, rows: Sequence[SweepRow], most: int = MOST_NAMED) -> tuple[str, list[str]]:
    """('microbatches=1: REASON; microbatches=2: REASON; and 3 more', their distinct hints): the rows that cannot
    run, the first `most` named with their reasons and the rest counted ('' and [] when every row runs)."""
    failed = [r for r in rows if r.error]
    named = "; ".join(f"{parameter}={r.value}: {r.reason}" for r in failed[:most])
    by_hint: dict[str, list[str]] = {}
    for r in failed[:most]:
        if r.hint:
            by_hint.setdefault(r.hint, []).append(str(r.value))
    # several hints each say which values they are for: joined after the last reason, one that was
    # about microbatches=1 read as if it were about microbatches=3
    every = [str(r.value) for r in failed[:most]]
    hints = [hint if values == every else f"for {parameter}={', '.join(values)}: {hint}" for hint, values in by_hint.items()]
    return named + (f"; and {len(failed) - most:,} more" if len(failed) > most else ""), hints


def skipped_note(parameter: str, rows: Sequence[SweepRow]) -> str | None:
    """The line that says which values of a sweep were skipped and why; None when every value runs or none does
    (then `sweep_refusal` is the error)."""
    failed = sum(1 for r in rows if r.error)
    if failed in (0, len(rows)):
        return None
    return f"{failed} of {len(rows)} values cannot run and have no prediction: {failed_values(parameter, rows)[0]}"


def sweep_refusal(plan: Plan, profile: Profile, parameter: str, rows: Sequence[SweepRow],
                  calibration: Calibration | None = None, hardware: Hardware | None = None) -> PplanError:
    """The error of a sweep none of whose values can run: each value with its reason (bounded), and as the hint
    the reasons' own hints, each once, then the plan's own value when it runs (one more simulation, only on
    this path), else that the plan itself cannot run."""
    named, hints = failed_values(parameter, rows)
    own = plan.n_microbatches if parameter == "microbatches" else plan.schedule
    runs = all(r.value != own for r in rows) and _row(own, plan, profile, calibration, hardware).error is None
    if runs:
        hints.append(("or " if hints else "") + f"sweep values that can run, e.g. the plan's own: --sweep {parameter}={own}")
    else:
        hints.append(f"the plan itself ({parameter}={own}) cannot run with these options either: change it first")
    return PplanError(f"no value of the sweep can run ({len(rows)} tried): {named}", "; ".join(hints))


def sweep_grid(plan: Plan, profile: Profile, schedules: Iterable[str], counts: Iterable[int],
               calibration: Calibration | None = None) -> list[SweepRow]:
    """The plan's cuts under each schedule and each micro-batch count, at the plan's global batch; combinations
    a schedule cannot run are left out (the report draws only what can run)."""
    rows = []
    for name in schedules:
        for row in run_sweep(plan.with_(schedule=name, predicted=None, search=None), profile, "microbatches",
                             list(counts), calibration):
            if row.error is None:
                rows.append(row)
    return rows


def sweep_to_dict(plan: Plan, parameter: str, rows: list[SweepRow], keep: str, basis: str) -> dict[str, Any]:
    """The JSON `pplan simulate --sweep --json` prints and `--out` writes."""
    return {"sweep": parameter, "keep": keep if parameter == "microbatches" else None, "basis": basis,
            "schedule": plan.schedule, "n_microbatches": plan.n_microbatches,
            "micro_batch_size": plan.micro_batch_size, "global_batch": plan.global_batch,
            "rows": [r.as_dict() for r in rows]}


def check_sweep_actions(plan: Plan, parameter: str, values: list[Any], keep: str = "global-batch") -> int:
    """The compute actions the sweep simulates, all values together; PplanError beyond MAX_SIMULATED_ACTIONS (one
    sweep costs at most what one largest simulation does). A value the batch cannot take counts nothing."""
    from planner.cost import actions_per_microbatch

    total, largest = 0, (None, 0)  # (value, its actions)
    for value in values:
        schedule, m = (plan.schedule, value) if parameter == "microbatches" else (value, plan.n_microbatches)
        if parameter == "microbatches":
            try:
                m = split_batch(plan, value, None, keep)[0]
            except PplanError:
                continue
        n = actions_per_microbatch(get_schedule(schedule).split_backward) * plan.n_stages * m
        total += n
        largest = (value, n) if n > largest[1] else largest
    if total > MAX_SIMULATED_ACTIONS:
        raise PplanError(f"--sweep {parameter} over {len(values)} values is {total:,} actions to simulate with "
                         f"{plan.n_stages} stages, beyond the simulator's bound of {MAX_SIMULATED_ACTIONS:,} for one command",
                         f"sweep fewer or smaller values (the largest, {largest[0]}, is {largest[1]:,} actions)")
    return total
