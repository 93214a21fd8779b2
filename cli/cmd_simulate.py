"""`pplan simulate`: predicted iteration time, bubble and memory of a plan, with what-if flags.

Thin: parse, call planner.simulate / planner.simulation.sweep, print, write outputs atomically
(all outputs are computed before the first file is written, so an error leaves no file behind).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer

from cli.common import echo_json, err

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    app.command("simulate")(simulate_cmd)


def simulate_cmd(
    plan_path: Path = typer.Argument(..., metavar="PLAN.json", help="Plan JSON (from `pplan partition` or written by hand)."),
    profile: Optional[Path] = typer.Option(None, "--profile", help="Profile CSV (default: the one the plan names)."),
    calibration: Optional[Path] = typer.Option(None, "--calibration", help="Calibration JSON (default: the one beside the profile, if any)."),
    as_json: bool = typer.Option(False, "--json", help="Print the simulation JSON instead of a table."),
    out: Optional[Path] = typer.Option(None, "--out", help="Write the simulation JSON here."),
    timeline: Optional[Path] = typer.Option(None, "--timeline", help="Write the timeline CSV here."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Draw the Gantt chart (or the sweep) to this PNG/SVG."),
    schedule: Optional[str] = typer.Option(None, "--schedule", help="What if: gpipe, 1f1b, interleaved or zb."),
    microbatches: Optional[int] = typer.Option(None, "--microbatches", help="What if: micro-batches per iteration (micro-batch size kept)."),
    micro_batch_size: Optional[int] = typer.Option(None, "--micro-batch-size", help="What if: samples per micro-batch (count kept)."),
    bandwidth: Optional[str] = typer.Option(None, "--bandwidth", help="What if: every link's bandwidth, e.g. 25GB/s."),
    latency: Optional[str] = typer.Option(None, "--latency", help="What if: every link's latency, e.g. 0.01ms."),
    sweep: Optional[str] = typer.Option(None, "--sweep", help="Sweep one parameter: microbatches=1,2,4,8 or schedule=gpipe,1f1b,zb."),
) -> None:
    """Simulate one training iteration of a plan: time, throughput, bubble, memory per device.

    Flags override the plan for what-if questions; --microbatches keeps the micro-batch size,
    so the global batch changes with it. --bandwidth/--latency replace every link's values (and
    win over a calibration's).
    """
    from dataclasses import replace

    from planner.atomic import ensure_writable_file
    from planner.calibration import find_calibration, load_calibration
    from planner.plan import load_plan
    from planner.simulation.sweep import parse_sweep

    sweep_spec = parse_sweep(sweep) if sweep is not None else None
    if sweep_spec is not None and timeline is not None:
        raise _err("--timeline cannot be combined with --sweep", "run one simulation per timeline")
    for path, suffixes, flag in ((plot, (".png", ".svg"), "--plot"), (out, (".json",), "--out"), (timeline, (".csv",), "--timeline")):
        if path is not None and path.suffix.lower() not in suffixes:
            raise _err(f"{flag} {str(path)!r} must end in {' or '.join(suffixes)}")
        if path is not None:
            ensure_writable_file(path, flag)  # before any work: an output that cannot be written fails now
    plan = load_plan(plan_path)
    prof, prof_path = _load_profile(plan, plan_path, profile)
    cal = load_calibration(calibration) if calibration is not None else find_calibration(prof_path)
    plan = _what_if(plan, schedule, microbatches, micro_batch_size, bandwidth, latency)
    if cal is not None and (bandwidth is not None or latency is not None):
        cal = replace(cal, comm_bandwidth_bytes_per_s=None if bandwidth is not None else cal.comm_bandwidth_bytes_per_s,
                      comm_latency_ms=None if latency is not None else cal.comm_latency_ms)
    if sweep_spec is not None:
        _do_sweep(plan, prof, cal, sweep_spec, as_json, out, plot)
        return
    _do_simulate(plan, prof, prof_path, cal, calibration, as_json, out, timeline, plot)


def _err(message: str, hint: str | None = None) -> Exception:
    from planner.errors import PplanError

    return PplanError(message, hint)


def _load_profile(plan: Any, plan_path: Path, given: Optional[Path]) -> tuple[Any, Path]:
    from planner.profiling.profile import load_profile

    if given is not None:
        path = given
    elif plan.profile_path:
        path = Path(plan.profile_path)
        beside = plan_path.parent / plan.profile_path
        if not path.exists() and beside.exists():
            path = beside  # a relative path recorded by a plan that was moved with its profile
    else:
        raise _err(f"plan {str(plan_path)!r} names no profile", "pass --profile PROFILE.csv")
    prof = load_profile(path)
    if plan.profile_sha256 and prof.sha256 and plan.profile_sha256 != prof.sha256:
        err(f"warning: {path} differs from the profile the plan was made from (checksum changed)")
    return prof, path


def _what_if(plan: Any, schedule: Optional[str], microbatches: Optional[int], micro_batch_size: Optional[int],
             bandwidth: Optional[str], latency: Optional[str]) -> Any:
    from planner.plan import Links
    from planner.units import parse_bandwidth, parse_ms

    changes: dict[str, Any] = {}
    if schedule is not None:
        changes["schedule"] = schedule
    for flag, value, field in (("--microbatches", microbatches, "n_microbatches"), ("--micro-batch-size", micro_batch_size, "micro_batch_size")):
        if value is not None:
            if value < 1:
                raise _err(f"{flag} {value} must be at least 1")
            changes[field] = value
    if bandwidth is not None or latency is not None:
        bw = parse_bandwidth(bandwidth) if bandwidth is not None else None
        lat = parse_ms(latency, "latency") if latency is not None else None
        old = plan.links
        changes["links"] = Links(
            bandwidth_bytes_per_s=bw if bw is not None else old.bandwidth_bytes_per_s,
            latency_ms=lat if lat is not None else old.latency_ms,
            pairs=tuple((a, b, bw if bw is not None else pbw, lat if lat is not None else plat) for a, b, pbw, plat in old.pairs),
        )
    if not changes:
        return plan
    new = plan.with_(**changes)
    new.validate()
    return new


def _do_simulate(plan: Any, prof: Any, prof_path: Path, cal: Any, cal_path: Optional[Path], as_json: bool,
                 out: Optional[Path], timeline: Optional[Path], plot: Optional[Path]) -> None:
    from planner.atomic import atomic_write_bytes, atomic_write_text
    from planner.simulate import simulate
    from planner.simulation.timeline import timeline_csv_text

    result = simulate(plan, prof, calibration=cal, record_timeline=True)
    data = result.to_dict()
    payloads: list[tuple[Path, bytes]] = []
    if out is not None:
        payloads.append((out, (json.dumps(data, indent=2, allow_nan=False) + "\n").encode()))
    if timeline is not None:
        payloads.append((timeline, timeline_csv_text(result.timeline).encode()))
    if plot is not None:
        from planner.report.gantt import gantt_png

        title = (f"{plan.schedule}: {plan.n_devices} devices, {plan.n_microbatches} micro-batches of "
                 f"{plan.micro_batch_size} — predicted iteration {result.iteration_ms:.2f} ms, bubble {100 * result.bubble_fraction:.1f}%")
        payloads.append((plot, gantt_png(result.timeline, title=title, device_names=result.device_names,
                                         fmt=plot.suffix.lower().lstrip("."))))
    for path, payload in payloads:
        if path.suffix.lower() in (".json", ".csv"):
            atomic_write_text(path, payload.decode())
        else:
            atomic_write_bytes(path, payload)
    if as_json:
        echo_json(data)
        return
    cal_note = "none" if cal is None else str(cal_path or "beside the profile")
    _print_summary(plan, result, prof_path, cal_note, prof)
    for path, _ in payloads:
        err(f"wrote {path}")


def _print_summary(plan: Any, r: Any, prof_path: Path, cal_note: str, prof: Any) -> None:
    from planner.units import format_bytes, format_ms

    echo = typer.echo
    echo(f"schedule {plan.schedule}: {plan.n_devices} devices x {plan.virtual_stages} stage(s), "
         f"{plan.n_microbatches} micro-batches of {plan.micro_batch_size} (global batch {plan.global_batch})")
    echo(f"profile {prof_path}; calibration {cal_note}")
    if r.interpolated:
        echo(f"note: micro-batch size {plan.micro_batch_size} was not profiled (measured: "
             f"{', '.join(map(str, prof.micro_batch_sizes))}); costs are interpolated")
    echo(f"iteration  {format_ms(r.iteration_ms)}   throughput {r.throughput_samples_per_s:,.1f} samples/s   "
         f"bubble {100 * r.bubble_fraction:.1f}%")
    echo("")
    head = ["device", "name", "busy", "idle", "peak memory", "limit", "weights", "grads", "optimizer", "activations", "buffers"]
    table = [head]
    for d in range(r.n_devices):
        m = r.memory[d]
        limit = r.memory_limit_bytes[d]
        over = limit is not None and r.peak_memory_bytes[d] > limit
        table.append([
            str(d), r.device_names[d], format_ms(r.busy_ms[d]), format_ms(r.idle_ms[d]),
            format_bytes(r.peak_memory_bytes[d]) + (" OVER" if over else ""),
            "-" if limit is None else format_bytes(limit),
            format_bytes(m.weights), format_bytes(m.gradients), format_bytes(m.optimizer),
            format_bytes(m.activations), format_bytes(m.buffers),
        ])
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    for row in table:
        echo("  ".join(cell.ljust(w) if i < 2 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))).rstrip())
    if not r.fits:
        over = [str(d) for d in range(r.n_devices) if r.memory_limit_bytes[d] is not None and r.peak_memory_bytes[d] > r.memory_limit_bytes[d]]
        echo(f"warning: device(s) {', '.join(over)} exceed their memory limit; try recompute, more micro-batches with 1f1b, or `pplan partition`")


def _do_sweep(plan: Any, prof: Any, cal: Any, spec: tuple[str, list[Any]], as_json: bool,
              out: Optional[Path], plot: Optional[Path]) -> None:
    from planner.atomic import atomic_write_bytes, atomic_write_text
    from planner.simulation.sweep import run_sweep
    from planner.units import format_bytes, format_ms

    parameter, values = spec
    rows = run_sweep(plan, prof, parameter, values, calibration=cal)
    if all(r.error for r in rows):
        raise _err(f"no value of the sweep can run: {rows[0].error}")
    data = {"sweep": parameter, "schedule": plan.schedule, "n_microbatches": plan.n_microbatches,
            "micro_batch_size": plan.micro_batch_size, "rows": [r.as_dict() for r in rows]}
    payloads: list[tuple[Path, Any]] = []
    if out is not None:
        payloads.append((out, json.dumps(data, indent=2, allow_nan=False) + "\n"))
    if plot is not None:
        from planner.report.style import render
        from planner.simulation.sweep import sweep_figure

        what = "micro-batch count" if parameter == "microbatches" else "schedule"
        fixed = f"{plan.schedule}, " if parameter == "microbatches" else f"{plan.n_microbatches} micro-batches, "
        fig = sweep_figure(parameter, rows, f"Predicted iteration time by {what} ({fixed}micro-batch size {plan.micro_batch_size})")
        payloads.append((plot, render(fig, plot.suffix.lower().lstrip("."))))
    for path, payload in payloads:
        (atomic_write_text if isinstance(payload, str) else atomic_write_bytes)(path, payload)
    if as_json:
        echo_json(data)
        return
    label = "micro-batches" if parameter == "microbatches" else "schedule"
    typer.echo(f"{label:>13}  {'iteration':>10}  {'bubble':>7}  {'samples/s':>11}  {'peak memory':>11}  fits")
    for r in rows:
        if r.error:
            typer.echo(f"{str(r.value):>13}  cannot run: {r.error}")
            continue
        typer.echo(f"{str(r.value):>13}  {format_ms(r.iteration_ms):>10}  {100 * r.bubble_fraction:6.1f}%  "
                   f"{r.throughput_samples_per_s:11,.1f}  {format_bytes(r.peak_memory_bytes):>11}  {'yes' if r.fits else 'NO'}")
    for path, _ in payloads:
        err(f"wrote {path}")
