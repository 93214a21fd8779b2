"""The key numbers at the top of a report, computed from whatever inputs exist."""

from __future__ import annotations

from typing import Any, Sequence

from planner.plan import Prediction
from planner.plan.checks import profile_change
from planner.plan.devicelist import list_devices
from planner.report.fig_baselines import SplitBar
from planner.report.inputs import ReportInputs
from planner.simulation.result import what_if_text
from planner.units import format_bytes, format_ms, format_share

__all__ = ["key_numbers", "predicted_iteration_ms", "peak_rows", "plan_line", "warnings", "what_if_row"]


def predicted_iteration_ms(inputs: ReportInputs) -> float | None:
    """The prediction for the plan as given: simulation, else the plan's recorded prediction."""
    for source in (inputs.sim.prediction if inputs.sim else None, inputs.plan.predicted if inputs.plan else None):
        value = source.iteration_ms if source is not None else None
        if isinstance(value, (int, float)) and value > 0:
            return float(value)
    return None


def peak_rows(inputs: ReportInputs) -> list[tuple[int, float | None, float | None, float | None]]:
    """(device, predicted peak bytes, measured peak bytes, limit bytes) per pipeline device.

    Under data parallelism several ranks play one device (rank = replica x P + device): the
    device's measured peak is the largest of its ranks', the one its memory limit must hold."""
    rows: dict[int, list[Any]] = {}
    for d in (inputs.sim.prediction.devices or ()) if inputs.sim is not None else ():
        if d.device is not None:
            rows[d.device] = [d.peak_memory_bytes, None, d.memory_limit_bytes]
    for r in inputs.run.ranks if inputs.run is not None else ():
        row = rows.setdefault(r.device, [None, None, None])
        row[0] = row[0] or r.peak_memory_bytes_predicted
        if r.peak_memory_bytes_measured is not None:
            row[1] = max(row[1] or 0, r.peak_memory_bytes_measured)
    if inputs.plan is not None:
        for i, device in enumerate(inputs.plan.devices):
            if i in rows and rows[i][2] is None:
                rows[i][2] = device.memory_bytes
    return [(dev, *(float(v) if isinstance(v, (int, float)) and v else None for v in row))
            for dev, row in sorted(rows.items())]


def plan_line(plan: Any) -> str:
    """One line: schedule, micro-batching, devices (a plan with a `parallel` object: its layout and
    the processes a run takes), and each stage's layers and recompute (past 64 stages the first and
    last few, as planner.plan.devicelist lists devices: 4,000 would fill pages)."""
    listing = list_devices(plan.n_stages)
    parts = []
    for s in listing.shown:
        if gap := listing.gap_before(s):
            parts.append(f"... {gap:,} stages not listed ...")
        st = plan.stages[s]
        parts.append(f"[{st.layers[0]}, {st.layers[1]})" + (f" recompute {list(st.recompute)}" if st.recompute else "")
                     + f" on dev {st.device}")
    cuts = ", ".join(parts)
    if plan.parallel is None:
        where = f" on {plan.n_devices} devices"
    else:  # each pipeline device is dp x tp processes: "on 1 devices" would hide three of four
        where = f", layout {plan.parallel.describe()} on {plan.n_processes} processes"
    per_replica = " per replica" if plan.dp > 1 else ""
    return (f"{plan.schedule}, {plan.n_microbatches} micro-batches of {plan.micro_batch_size}{per_replica} "
            f"(global batch {plan.global_batch}){where}; layers {cuts}")


def _prediction(inputs: ReportInputs) -> Prediction | None:
    """The simulation's prediction, else the one the plan records."""
    if inputs.sim is not None:
        return inputs.sim.prediction
    return inputs.plan.predicted if inputs.plan is not None else None


def key_numbers(inputs: ReportInputs, baselines: Sequence[SplitBar] = (),
                extra_warnings: Sequence[str] = ()) -> list[tuple[str, str]]:
    """(quantity, value) rows: plan, predicted and measured time, memory against limits, speedup.
    `extra_warnings`: lines found while deriving (e.g. Derived.calibration_warning), after the inputs' own."""
    rows: list[tuple[str, str]] = []
    rows += [("warning", line) for line in [*warnings(inputs), *extra_warnings]]
    if inputs.plan is not None:
        rows.append(("plan", plan_line(inputs.plan)))
    if (changed := what_if_row(inputs)) is not None:
        rows.append(changed)
    own_basis = _own_basis_row(inputs)
    if own_basis is not None and not _sim_given(inputs):  # the simulation shown is the report's own
        rows.append(own_basis)
    predicted = predicted_iteration_ms(inputs)
    if predicted is not None:
        rows += _given_basis_rows(inputs)
        label = "predicted iteration time" if inputs.sim is None else f"predicted iteration time ({_sim_label(inputs)})"
        if inputs.sim_is_fit:
            label = "iteration time fitted on this run (calibrated: a fit, not a prediction)"
        rows.append((label, format_ms(predicted)))
    prediction = _prediction(inputs)
    if prediction is not None and prediction.bubble_fraction is not None:
        rows.append(("predicted bubble fraction", f"{prediction.bubble_fraction:.1%}"))
    if prediction is not None and prediction.throughput_samples_per_s is not None:
        rows.append(("predicted throughput", f"{prediction.throughput_samples_per_s:.1f} samples/s"))
    if own_basis is not None and _sim_given(inputs):  # what the report simulated beside the given simulation
        rows.append(own_basis)
    run = inputs.run
    measured = run.iteration_ms_measured if run is not None else None
    if measured is not None and measured > 0:
        timed = run.measured_steps
        note = f" (median of {len(timed)} timed steps)" if timed else ""
        rows.append(("measured iteration time", format_ms(measured) + note))
        run_pred = run.iteration_ms_predicted
        # Signed like the run JSON's error_pct: (predicted - measured) / measured.
        if isinstance(run_pred, (int, float)) and run_pred > 0:
            rows.append(("prediction error (plan)", f"{(run_pred - measured) / measured:+.1%} "
                                                      f"(predicted {format_ms(run_pred)})"))
        if inputs.sim is not None and predicted and (not isinstance(run_pred, (int, float))
                                                     or abs(predicted - run_pred) > 1e-3 * predicted):
            if inputs.sim_is_fit:
                rows.append(("fit residual (calibrated on this same run: not a prediction error)",
                             f"{(predicted - measured) / measured:+.1%} (fitted {format_ms(predicted)})"))
            else:
                rows.append((f"prediction error ({_sim_label(inputs)})", f"{(predicted - measured) / measured:+.1%} "
                                                                       f"(predicted {format_ms(predicted)})"))
    rows += _peak_memory_rows(inputs)
    search = inputs.plan.search if inputs.plan is not None else None
    recompute, calibrated = (search.recompute, search.calibrated) if search is not None else (None, None)
    rows += _baseline_rows(baselines, predicted, recompute, calibrated)
    return rows


def what_if_row(inputs: ReportInputs) -> tuple[str, str] | None:
    """For a simulation of a what-if (`pplan simulate --bandwidth ...`, its JSON's `what_if`), the row saying so
    and what it changed, so that its numbers are not read as the plan's; None for a simulation of the plan itself."""
    changes = inputs.sim.what_if if inputs.sim is not None else None
    if not changes:
        return None
    source = inputs.sources.get("sim", "the simulation")
    return (f"what-if simulation ({source})", f"not the plan as it is: {what_if_text(changes)}")


def _sim_label(inputs: ReportInputs) -> str:
    """How rows name the simulation's numbers: 'what-if simulation' for a what-if's."""
    return f"what-if {inputs.sim_label}" if inputs.sim is not None and inputs.sim.what_if else inputs.sim_label


def _sim_given(inputs: ReportInputs) -> bool:
    """Whether the simulation shown is a given file (--sim), not one the report computed."""
    return inputs.sim is not None and "sim" in inputs.sources


def _own_basis_row(inputs: ReportInputs) -> tuple[str, str] | None:
    """The basis of what the report simulated itself (derive), labelled apart from a given simulation's."""
    if inputs.basis is None:
        return None
    if _sim_given(inputs):
        return f"basis of what the report simulates itself (not {inputs.sources['sim']})", inputs.basis
    return "basis of what the report simulates", inputs.basis


def _given_basis_rows(inputs: ReportInputs) -> list[tuple[str, str]]:
    """The basis of a predicted iteration time the report read rather than computed, as its file records
    it: the given simulation's `basis`, else (no simulation) what `pplan partition` recorded for the plan."""
    if _sim_given(inputs):
        source = inputs.sources["sim"]
        return [(f"basis of the given simulation ({source})", inputs.sim.basis or f"not recorded in {source}")]
    search = inputs.plan.search if inputs.sim is None and inputs.plan is not None else None
    if search is not None and search.calibrated is not None:
        return [("basis of the plan's recorded prediction",
                 f"{'calibrated' if search.calibrated else 'uncalibrated'} (as `pplan partition` recorded it)")]
    return []


def _peak_memory_rows(inputs: ReportInputs) -> list[tuple[str, str]]:
    """One row per device with a peak (planner.plan.devicelist: all up to 64; else the first and last
    few and the extremes, and a row saying how many were left out and which files hold every one)."""
    peaks = [row for row in peak_rows(inputs) if any(row[1:])]
    used = [max((v for v in (pred, meas) if v), default=0.0) / limit if limit else None
            for _, pred, meas, limit in peaks]
    listing = list_devices(len(peaks), [("most memory predicted", [row[1] for row in peaks]),
                                        ("most memory measured", [row[2] for row in peaks]),
                                        ("most of its limit used", used)])
    rows = []
    for position in listing.shown:
        dev, pred, meas, limit = peaks[position]
        parts = [f"predicted {format_bytes(pred)}"] if pred else []
        if meas:
            parts.append(f"measured {format_bytes(meas)}")
        if limit:
            parts.append(f"limit {format_bytes(limit)} ({format_share(used[position], 1.0)} used)")
        label = listing.label(position)
        rows.append((f"peak memory dev {dev}" + (f" ({label})" if label else ""), ", ".join(parts)))
    if (line := listing.left_out_line(_every_device(inputs))) is not None:
        rows.append(("peak memory, devices not listed", line))
    return rows


def _every_device(inputs: ReportInputs) -> str:
    """Where every device's peak memory is: the simulation and run JSON given, else the command that writes it."""
    files = [f"the {what} JSON {inputs.sources[key]}" for key, what in (("sim", "simulation"), ("run", "run"))
             if key in inputs.sources]
    if files:
        return " and ".join(files)
    plan = inputs.sources.get("plan", "PLAN")
    return f"`pplan simulate {plan} --out sim.json` writes them"


def warnings(inputs: ReportInputs) -> list[str]:
    """Lines that say an input is not what it claims: the loader's (a plan's prediction made for
    another plan, dropped) and a profile whose checksum differs from the one the plan was made from,
    in the words `pplan simulate` prints (planner.plan.checks.profile_change). A calibration fitted
    on another model or profile is derive's to say (Derived.calibration_warning): it resolved it."""
    lines = list(inputs.warnings)
    if inputs.plan is not None and inputs.profile is not None:
        if (changed := profile_change(inputs.plan, inputs.profile)) is not None:
            lines.append(changed)
    return lines


def _baseline_rows(baselines: Sequence[SplitBar], predicted: float | None,
                   recompute: str | None = None, calibrated: bool | None = None) -> list[tuple[str, str]]:
    """One row per baseline (as `pplan partition` evaluated it): fits or not, and time against the plan."""
    rows = []
    mine = next((b for b in baselines if b.is_plan), None)
    ours = (mine.iteration_ms if mine is not None else None) or predicted
    with_recompute = recompute not in (None, "none")
    for b in baselines:
        if b.is_plan:
            continue
        parts = []
        if not b.feasible:
            need = b.peak_memory_bytes
            parts.append("does not fit the memory limit" + (
                f": needs {format_bytes(need)}{' even with recompute' if with_recompute else ''}" if need else ""))
        else:
            parts.append("fits")
        if ours and b.iteration_ms:
            ratio = b.iteration_ms / ours
            detail = f"{format_ms(b.iteration_ms)} predicted"
            if abs(ratio - 1) >= 0.005:
                detail += f", {ratio:.2f}x the plan's {format_ms(ours)}"
            parts.append(detail)
        basis = {True: " (partition's prediction, calibrated)",
                 False: " (partition's prediction, uncalibrated)"}.get(calibrated, "")
        rows.append((f"vs {b.name} split{basis}", "; ".join(parts)))
    return rows
