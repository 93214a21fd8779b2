"""`pplan simulate`: predicted iteration time, bubble and memory of a plan, with what-if flags.

Thin: declare options, make one library call (planner.whatif.what_if, which checks the flags
and the outputs before any work), print, write outputs atomically (all outputs are computed
before the first file is written, so an error leaves no file behind).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from cli.common import check_calibration_input, check_hardware_input, check_plan_inputs, echo_json, err
from cli.options import CalibrationOption, PlanArgument

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    app.command("simulate")(simulate_cmd)


def simulate_cmd(
    plan_path: PlanArgument,
    profile: Annotated[Optional[Path], typer.Option("--profile", help="Profile CSV (default: the one the plan names).")] = None,
    calibration: CalibrationOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the simulation JSON instead of a table.")] = False,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Write the simulation JSON here.")] = None,
    timeline: Annotated[Optional[Path], typer.Option("--timeline", help="Write the timeline CSV here.")] = None,
    plot: Annotated[Optional[Path], typer.Option("--plot", help="Draw the Gantt chart (or the sweep) to this PNG/SVG.")] = None,
    schedule: Annotated[Optional[str], typer.Option("--schedule", help="What if: gpipe, 1f1b, interleaved or zb.")] = None,
    microbatches: Annotated[Optional[int], typer.Option("--microbatches", help="What if: micro-batches per iteration (see --keep).")] = None,
    micro_batch_size: Annotated[Optional[int], typer.Option("--micro-batch-size", help="What if: samples per micro-batch (see --keep).")] = None,
    keep: Annotated[Optional[str], typer.Option("--keep", help="What --microbatches or --micro-batch-size given alone, and --sweep microbatches, keep: global-batch (the default, as partition does) or micro-batch-size. Given both, the global batch is their product (with --keep global-batch it must be the plan's). Refused without a micro-batch change.", show_default=False)] = None,
    bandwidth: Annotated[Optional[str], typer.Option("--bandwidth", help="What if: every pipeline link's bandwidth, e.g. 25GB/s; a plain number is bytes/s (a data/tensor-parallel plan's collectives keep its hardware's links: see --hardware).")] = None,
    latency: Annotated[Optional[str], typer.Option("--latency", help="What if: every pipeline link's latency, e.g. 0.01ms; a plain number is ms (collectives as for --bandwidth).")] = None,
    sweep: Annotated[Optional[str], typer.Option("--sweep", help="Sweep one parameter: microbatches=1,2,4,8 or schedule=gpipe,1f1b,zb.")] = None,
    hardware: Annotated[Optional[str], typer.Option("--hardware", help="Data/tensor-parallel plans only: price the plan on this preset or hardware JSON instead of the one it recorded: each GPU's memory limit, GPUs per node (the plan's tp must divide them), the pipeline, tensor- and data-parallel links, and the peak that MFU divides by (an MFU above 100% is refused, as partition refuses it). Compute times stay the profile's, but for the norms and residual adds a tensor-parallel block runs whole on every rank, priced at this hardware's memory bandwidth.")] = None,
) -> None:
    """Simulate one training iteration of a plan: time, throughput, bubble, memory per device.

    Flags override the plan for what-if questions. --microbatches M keeps the global batch
    (M micro-batches of global batch / M samples), as `pplan partition` does; --keep
    micro-batch-size keeps the plan's micro-batch size instead, so the global batch changes.
    --bandwidth/--latency replace every pipeline link's values (and win over a calibration's). The
    output names the basis: the profile as measured, or the calibration applied.

    A plan from `pplan partition --nodes` (data x pipeline x tensor parallelism) simulates one
    pipeline replica on its hardware, with the tensor-parallel collectives and the gradient
    sync on the timeline, and reports tokens/s, TFLOP/s per GPU, MFU and memory per GPU.
    """
    from planner.units import parse_link_bandwidth, parse_ms
    from planner.whatif import SimulationOutputs, WhatIf, what_if

    # each flag's own value first (the records check their own: WhatIf a count below 1), then the
    # input files, then what_if: how flags combine, outputs writable
    outputs = SimulationOutputs(out=out, timeline=timeline, plot=plot)
    change = WhatIf(schedule=schedule, n_microbatches=microbatches, micro_batch_size=micro_batch_size,
                    bandwidth_bytes_per_s=parse_link_bandwidth(bandwidth, "--bandwidth") if bandwidth is not None else None,
                    latency_ms=parse_ms(latency, "--latency") if latency is not None else None, keep=keep)
    check_plan_inputs(plan_path, profile)
    check_calibration_input(calibration)
    check_hardware_input(hardware)
    # every box and the memory curve are kept only for what shows them: the JSON printed (it holds the curve), the outputs
    result = what_if(plan_path, change, sweep=sweep, profile=profile, calibration=calibration, hardware=hardware,
                     record_timeline=as_json, outputs=outputs)
    for line in result.warnings:
        err(f"pplan: warning: {line}")
    if result.parameter is not None:
        _do_sweep(result, as_json, out, plot)
        return
    _do_simulate(result, as_json, out, timeline, plot)


def _do_simulate(w: Any, as_json: bool, out: Optional[Path], timeline: Optional[Path], plot: Optional[Path]) -> None:
    from planner.atomic import atomic_write_bytes, atomic_write_text
    from planner.simulation.timeline import timeline_csv_text

    plan, result = w.plan, w.sim
    data = replace(result.record(), basis=w.basis, what_if=w.changes).to_dict()
    payloads: list[tuple[Path, bytes]] = []
    if out is not None:
        payloads.append((out, (json.dumps(data, indent=2, allow_nan=False) + "\n").encode()))
    if timeline is not None:
        payloads.append((timeline, timeline_csv_text(result.timeline).encode()))
    if plot is not None:
        from planner.report.gantt import drawn_devices, gantt_png

        title = (f"{plan.schedule}: {drawn_devices(plan, w.setup.profile.meta.get('model'))}, {plan.n_microbatches} micro-batches of "
                 f"{plan.micro_batch_size} — predicted iteration {result.iteration_ms:.2f} ms, bubble {100 * result.bubble_fraction:.1f}% "
                 f"({'calibrated' if w.calibration is not None else 'uncalibrated'})")
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
    _print_summary(plan, result, w.setup.profile_path, w.basis, w.setup.profile, out, w.changes)
    for path, _ in payloads:
        err(f"wrote {path}")


def _print_summary(plan: Any, r: Any, prof_path: Path, basis: str, prof: Any, out: Optional[Path],
                   changes: Optional[dict[str, Any]] = None) -> None:
    from planner.plan.devicelist import list_devices
    from planner.simulation.result import what_if_text
    from planner.units import format_bytes, format_ms

    echo = typer.echo
    echo(f"schedule {plan.schedule}: {plan.n_devices} devices x {plan.virtual_stages} stage(s), "
         f"{plan.n_microbatches} micro-batches of {plan.micro_batch_size} (global batch {plan.global_batch})")
    if changes:
        echo(f"what-if: {what_if_text(changes)}")
    echo(f"profile {prof_path}; basis: {basis}")
    if r.interpolated:
        echo(f"note: micro-batch size {plan.micro_batch_size} was not profiled: {prof.size_note(plan.micro_batch_size)}")
    echo(f"iteration  {format_ms(r.iteration_ms)}   throughput {r.throughput_samples_per_s:,.1f} samples/s   "
         f"bubble {100 * r.bubble_fraction:.1f}%")
    if r.replica is not None:
        _print_replica(r.replica, plan.parallel.dp, plan.parallel.tp, any(st.recompute for st in plan.stages))
    echo("")
    head = ["device", "name", "busy", "idle", "peak memory", "limit", "weights", "grads", "optimizer", "activations", "buffers"]
    table = [head]
    listing = list_devices(r.n_devices, [("slowest", r.busy_ms), ("most memory", r.peak_memory_bytes)])
    for d in listing.shown:
        if gap := listing.gap_before(d):
            table.append(["...", f"({gap:,} not listed)"] + [""] * (len(head) - 2))
        m = r.memory[d]
        limit = r.memory_limit_bytes[d]
        over = limit is not None and r.peak_memory_bytes[d] > limit
        label = listing.label(d)
        table.append([
            str(d), r.device_names[d] + (f" ({label})" if label else ""), format_ms(r.busy_ms[d]), format_ms(r.idle_ms[d]),
            format_bytes(r.peak_memory_bytes[d]) + (" OVER" if over else ""),
            "-" if limit is None else format_bytes(limit),
            format_bytes(m.weights), format_bytes(m.gradients), format_bytes(m.optimizer),
            format_bytes(m.activations), format_bytes(m.buffers),
        ])
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    for row in table:
        echo("  ".join(cell.ljust(w) if i < 2 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))).rstrip())
    where = f"the simulation JSON {out}" if out is not None else "the simulation JSON (--out FILE.json, or --json)"
    if (line := listing.left_out_line(where)) is not None:
        echo(line)
    if not r.fits:
        over = [d for d in range(r.n_devices) if r.memory_limit_bytes[d] is not None and r.peak_memory_bytes[d] > r.memory_limit_bytes[d]]
        echo(f"warning: {_devices_in_words(over)} exceed their memory limit; try recompute, more micro-batches with 1f1b, or `pplan partition`")


def _fits(row: Any) -> str:
    """A sweep row's fits column: yes?, as partition's table says it, where the memory is a lower bound."""
    return ("yes?" if row.memory_unpriced else "yes") if row.fits else "NO"


def _devices_in_words(devices: list[int], most: int = 8) -> str:
    """'device(s) 0, 3' for a few; the first `most` and how many more for many (4,000 numbers are no warning)."""
    listed = ", ".join(map(str, devices[:most]))
    more = f" and {len(devices) - most:,} more ({len(devices):,} devices)" if len(devices) > most else ""
    return f"device(s) {listed}{more}"


def _print_replica(rep: Any, dp: int, tp: int, recomputes: bool) -> None:
    """The replica's throughput and communication: the gradient sync only where dp > 1 has one, the
    tensor-parallel collectives only where tp > 1 has some."""
    from planner.units import format_ms

    typer.echo(f"cluster    {rep.layout} on {rep.gpus} x {rep.hardware}, global batch {rep.global_batch}: "
               f"{rep.tokens_per_s:,.0f} tokens/s, {rep.tflops_per_gpu:.1f} TFLOP/s per GPU, MFU {100 * rep.mfu:.1f}%")
    terms = []
    if dp > 1:
        terms.append(f"gradient sync {format_ms(rep.grad_sync_ms)} per iteration ({format_ms(rep.grad_sync_exposed_ms)} exposed)")
    if tp > 1:
        incl = " incl. recomputed forward" if recomputes and rep.tp_comm_ms > 0 else ""
        terms.append(f"tensor-parallel collectives {format_ms(rep.tp_comm_ms)} per micro-batch{incl}")
    typer.echo(f"comm       {', '.join(terms) or 'none (dp=1, tp=1)'}; memory below is per GPU")


def _do_sweep(w: Any, as_json: bool, out: Optional[Path], plot: Optional[Path]) -> None:
    from planner.atomic import atomic_write_bytes, atomic_write_text
    from planner.units import format_bytes, format_ms
    from planner.whatif import sweep_to_dict

    plan, parameter, rows = w.plan, w.parameter, w.rows
    data = sweep_to_dict(plan, parameter, list(rows), w.keep, w.basis)
    payloads: list[tuple[Path, Any]] = []
    if out is not None:
        payloads.append((out, json.dumps(data, indent=2, allow_nan=False) + "\n"))
    if plot is not None:
        from planner.report.fig_whatif import sweep_figure, sweep_title
        from planner.report.style import render

        fig = sweep_figure(parameter, list(rows), sweep_title(plan, parameter, w.keep, w.calibration is not None))
        payloads.append((plot, render(fig, plot.suffix.lower().lstrip("."))))
    for path, payload in payloads:
        (atomic_write_text if isinstance(payload, str) else atomic_write_bytes)(path, payload)
    if as_json:
        echo_json(data)
        if w.skipped is not None:  # the table names them in their rows; beside JSON, stderr does
            err(f"note: {w.skipped}")
        return
    echo = typer.echo
    if parameter == "microbatches":
        kept = "global batch kept" if w.keep == "global-batch" else "micro-batch size kept"
        echo(f"sweep of micro-batches, {plan.schedule} ({kept}); basis: {w.basis}")
    else:
        echo(f"sweep of schedules, {plan.n_microbatches} micro-batches of {plan.micro_batch_size}; basis: {w.basis}")
    echo(f"{'schedule':>11}  {'M':>5}  {'size':>5}  {'global':>6}  {'iteration':>10}  {'bubble':>7}  {'samples/s':>11}  "
         f"{'peak memory':>11}  fits")
    for r in rows:
        head = f"{r.schedule:>11}  {r.n_microbatches:>5}  {r.micro_batch_size or '-':>5}  {r.global_batch or '-':>6}"
        if r.error:
            echo(f"{head}  cannot run: {r.error}")
            continue
        note = f"  (size {w.setup.profile.size_basis(r.micro_batch_size)})" if r.interpolated else ""
        echo(f"{head}  {format_ms(r.iteration_ms):>10}  {100 * r.bubble_fraction:6.1f}%  "
             f"{r.throughput_samples_per_s:11,.1f}  {format_bytes(r.peak_memory_bytes):>11}  {_fits(r)}{note}")
    if any(r.fits and r.memory_unpriced for r in rows if not r.error):
        echo("  yes?: fits if what the profile does not measure (no wgrad_bytes column) is small; see the warning")
    for path, _ in payloads:
        err(f"wrote {path}")
