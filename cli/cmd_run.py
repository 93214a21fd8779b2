"""`pplan run PLAN.json`: train the plan with torch.distributed.pipelining, measure, compare.

`pplan calibrate PLAN.json` is `pplan run --calibrate`: it calls run_command with the same
options (cli/run_options.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from cli.common import at_least, check_input_file, check_plan_inputs, echo_json, err, parse_shape
from cli.options import PlanArgument
from cli.run_options import (
    CheckpointDir, CheckpointEvery, Force, Lr, RankThreads, RunDevice, RunInputDtype, RunInputShape, RunJson, RunOut,
    RunProfile, RunTimeline, RunVocab, Runtime, Steps, Timeout, TrustModel, Verbose, VouchModel, Warmup,
)
from planner.units import format_bytes, format_ms

if TYPE_CHECKING:
    from planner.execute.runrecord import RunRecord
    from planner.report.layout import RunLayout

__all__ = ["register", "run_command", "check_outputs", "check_inputs", "check_counts", "print_run", "memory_warnings"]


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.1f}%"


def print_run(run: RunRecord, out: Path | None, timeline: Path | None, zero: int = 0) -> None:
    """The human summary of a run (stdout). A run with data or tensor parallelism also says its
    layout (`zero`: the plan's ZeRO stage), each rank's replica and tensor-parallel rank, and the
    gradient all-reduce; one pipeline prints as it always has."""
    from planner.report.layout import run_layout

    layout = run_layout(run)
    where = "" if layout.one_pipeline else f"layout {layout.describe(zero)}, "
    per_replica = " per replica" if layout.dp > 1 else ""
    typer.echo(f"ran {run.plan or 'plan'}: {run.schedule}, {where}{run.n_ranks} rank(s), {run.n_stages} stage(s), "
               f"{run.n_microbatches} x {run.micro_batch_size} samples{per_replica}, "
               f"steps {run.first_step + 1}-{run.steps} on {run.device_type} ({run.runtime})")
    line = f"iteration: measured {format_ms(run.iteration_ms_measured)} (median of {len(run.measured_steps)} step(s))"
    if run.iteration_ms_predicted is not None:
        line += (f", predicted {format_ms(run.iteration_ms_predicted)} [{run.prediction_source}], "
                 f"error {_pct(run.error_pct)}")
    typer.echo(line)
    if layout.dp > 1:
        # ZeRO-2/3 average the gradients in the step's reduce-scatter: that is what the run timed
        sync = "reduce-scatter" if zero >= 2 else "all-reduce"
        typer.echo(f"gradient {sync}: measured {_ms_or_na(run.grad_allreduce_ms_measured)}, "
                   f"predicted {_ms_or_na(run.grad_allreduce_ms_predicted)} (inside the iteration)")
    for line in _rank_table(run, layout):
        typer.echo(line)
    for line in memory_warnings(run):
        err(f"pplan: warning: {line}")
    if run.losses:
        typer.echo(f"loss: {_loss(run.losses[0])} (step {run.loss_steps[0] + 1}) -> {_loss(run.losses[-1])} "
                   f"(step {run.loss_steps[-1] + 1})")
    fit = run.calibration_fit
    if fit is not None:
        cal = fit.calibration
        typer.echo(f"calibration: compute_scale {cal.compute_scale:.3f}, action_overhead {cal.action_overhead_ms:.3f} ms, "
                   f"step_overhead {cal.step_overhead_ms:.3f} ms, comm latency "
                   f"{'n/a' if cal.comm_latency_ms is None else format_ms(cal.comm_latency_ms)}, bandwidth "
                   f"{'n/a' if not cal.comm_bandwidth_bytes_per_s else format_bytes(cal.comm_bandwidth_bytes_per_s) + '/s'}")
        typer.echo(f"prediction error: before {_pct(fit.error_pct_before)} ({format_ms(fit.predicted_ms_before)}), "
                   f"after {_pct(fit.error_pct_after)} ({format_ms(fit.predicted_ms_after)}); wrote {fit.path}")
    for line in run.warnings:  # why this comparison should not be trusted (planner.execute.results)
        err(f"pplan: warning: {line}")
    for what, path in (("run", out), ("timeline", timeline)):
        if path is not None:
            typer.echo(f"wrote {what} {path}")


def memory_warnings(run: RunRecord) -> list[str]:
    """One line per rank whose measured peak passed its device's limit, with by how much: a few
    KiB over a 4.5 MiB limit reads 4.5 MiB on both sides once rounded."""
    lines = []
    for r in run.ranks:
        lim, mm = r.memory_limit_bytes, r.peak_memory_bytes_measured
        if lim is not None and mm is not None and mm > lim:
            over = f"{100 * (mm - lim) / lim:.2f}%" if lim else "no memory allowed"
            lines.append(f"rank {r.rank} peaked at {format_bytes(mm)} ({mm:,} B), {format_bytes(mm - lim)} ({over}) "
                         f"above its device's limit {format_bytes(lim)} ({lim:,} B) in the plan")
    return lines


def _rank_table(run: RunRecord, layout: RunLayout) -> list[str]:
    """The per-rank table: header and one line per rank; a replica column under data parallelism
    and a tp rank column under tensor parallelism, in the mesh's order (dp, pp, tp)."""
    def opt(value: float | None, fmt: Any) -> str:
        return fmt(value) if value is not None else "n/a"

    columns: list[tuple[str, str, Any]] = [("rank", ">4", lambda r: r.rank)]
    if layout.dp > 1:
        columns.append(("replica", ">7", lambda r: r.replica))
    columns.append(("device", ">6", lambda r: r.device))
    if layout.tp > 1:
        columns.append(("tp rank", ">7", lambda r: layout.tp_rank(r.rank)))
    columns += [("stages", "<8", lambda r: ",".join(map(str, r.stages))),
                ("busy", ">9", lambda r: format_ms(r.busy_ms)),
                ("busy pred", ">9", lambda r: opt(r.busy_ms_predicted, format_ms)),
                ("peak mem", ">10", lambda r: opt(r.peak_memory_bytes_measured, format_bytes)),
                ("predicted", ">10", lambda r: opt(r.peak_memory_bytes_predicted, format_bytes)),
                ("measure", "", lambda r: r.memory_measure or "")]
    return ["  ".join(format(name, spec) for name, spec, _ in columns)] + [
        "  ".join(format(value(r), spec) for _, spec, value in columns) for r in run.ranks]


def _ms_or_na(ms: float | None) -> str:
    return "n/a" if ms is None else format_ms(ms)


def _loss(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.6f}"


def check_outputs(out: Path | None, timeline: Path | None, checkpoint_dir: Path | None) -> None:
    """Refuse, before anything is read or launched, an output that could not be written at the end
    or whose name says another format than what is written into it (CSV in a .png)."""
    from planner.atomic import ensure_writable_dir, ensure_writable_file
    from planner.errors import PplanError

    for what, path, suffix in (("--out", out, ".json"), ("--timeline", timeline, ".csv")):
        if path is not None:
            if path.suffix.lower() != suffix:
                raise PplanError(f"{what} {str(path)!r} must end in {suffix}", f"it is written as {suffix[1:].upper()}")
            ensure_writable_file(path, what)
    if checkpoint_dir is not None:
        ensure_writable_dir(checkpoint_dir, "--checkpoint-dir")


def check_counts(*, steps: int, warmup: int | None, checkpoint_every: int, vocab: int | None) -> None:
    """Refuse a count below its least with what to give (planner.execute.options checks the same
    bounds later, naming them but not a value to use)."""
    at_least("--steps", steps, 1, "give the optimizer steps to train, e.g. --steps 10")
    at_least("--warmup", warmup, 0, "give the first steps left out of the timing, e.g. --warmup 2 (0: time every step)")
    at_least("--checkpoint-every", checkpoint_every, 0, "0 saves only at the end; e.g. --checkpoint-every 100")
    at_least("--vocab", vocab, 2, "give the token ids' upper bound, e.g. --vocab 32000")


def check_inputs(plan_path: Path, profile: Path | None, machine_file: Path | None = None) -> None:
    """Refuse, with what to give instead, a folder where the plan, the profile or a machine file is read."""
    check_plan_inputs(plan_path, profile)
    check_input_file(machine_file, "machine file", "machine",
                     make="make one with `pplan calibrate --machine --out FILE.json`, or leave --machine-file out")


def run_command(plan_path: Path, *, steps: int, warmup: int | None, lr: float, out: Path | None, timeline: Path | None,
                profile: Path | None, device: str, calibrate: bool, checkpoint_dir: Path | None, checkpoint_every: int,
                timeout: float, threads: int, runtime: str, force: bool, verbose: bool, json_out: bool,
                model: str | None = None, trust_model: bool = False, input_shape: str | None = None,
                input_dtype: str | None = None, vocab: int | None = None, machine_file: Path | None = None) -> None:
    """Shared body of `pplan run` and `pplan calibrate`.

    Everything that can be refused is refused before the plan's model is imported or any rank
    starts: the --runtime, every output path, then the plan: run_plan refuses a `module:factory`
    model that --model or --trust-model does not vouch for (planner.models.trust), then what
    its preflight finds (planner.execute.preflight).
    """
    import contextlib

    from planner.execute.job_watch import failures_shared
    from planner.execute.options import RunOptions
    from planner.execute.run import run_plan, runtime_prefers_torch  # imports no torch, and no model
    from planner.execute.worker import read_env
    from planner.plan import load_plan

    env = read_env()  # under torchrun this process is one rank of the job
    # Under torchrun only rank 0 writes --out, --timeline and the calibration, so only rank 0
    # checks them: another node's rank does not refuse a path it would never write.
    writes = env is None or env.rank == 0
    # A rank that fails under torchrun tells the other nodes' ranks, which leave with its reason at
    # once instead of waiting --timeout for it (planner.execute.job_watch).
    with failures_shared(env.rank) if env is not None else contextlib.nullcontext():
        check_counts(steps=steps, warmup=warmup, checkpoint_every=checkpoint_every, vocab=vocab)
        check_inputs(plan_path, profile, machine_file)
        prefer_torch = runtime_prefers_torch(runtime)
        check_outputs(out if writes else None, timeline if writes else None, checkpoint_dir)
        plan = load_plan(plan_path)
        if writes:
            _check_outputs_distinct(plan, plan_path, profile, out, timeline, machine_file, calibrate)
        if calibrate and writes:
            _check_calibration_writable(plan, plan_path, profile)
        opts = RunOptions(steps=steps, warmup=warmup, lr=lr, device=device, timeout_s=timeout,
                          checkpoint_dir=str(checkpoint_dir) if checkpoint_dir else None,
                          checkpoint_every=checkpoint_every, calibrate=calibrate, threads=threads,
                          prefer_torch=prefer_torch, verbose=verbose, input_shape=parse_shape(input_shape),
                          input_dtype=input_dtype, vocab=vocab)

        def starting() -> None:
            if env is None or env.rank == 0:
                err(f"running {plan_path}: {plan.n_processes} rank(s), {opts.steps} step(s)"
                    + (f" under torchrun ({env.world} processes)" if env else ""))

        outcome = run_plan(plan, opts, plan_path=str(plan_path), profile_path=str(profile) if profile else None,
                           force=force, out=out if writes else None, timeline_path=timeline if writes else None,
                           machine=machine_file, model=model, trust_model=trust_model, on_start=starting)
    if outcome is not None:  # None: a rank other than 0 under torchrun (rank 0 reports)
        if json_out:
            echo_json(outcome.record.to_dict())
        else:
            print_run(outcome.record, out, timeline, zero=plan.parallel.zero if plan.parallel and plan.dp > 1 else 0)
    if env is not None:
        _leave_rank()


def _leave_rank() -> None:
    """Under torchrun this process was a rank: leave without interpreter finalization, where
    gloo's threads can abort an otherwise successful rank (see planner.execute.worker)."""
    import os
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _check_outputs_distinct(plan: Any, plan_path: Path, profile: Path | None, out: Path | None, timeline: Path | None,
                            machine_file: Path | None, calibrate: bool) -> None:
    """Refuse an output that would replace a file the run reads (`--out PLAN.json`), or the
    calibration --calibrate writes beside the profile."""
    from planner.atomic import ensure_outputs_distinct
    from planner.calibration import calibration_path_for
    from planner.plan import resolve_profile_path

    prof = resolve_profile_path(plan, str(plan_path), str(profile) if profile else None)
    beside = calibration_path_for(prof) if prof is not None else None  # read when it exists, written by --calibrate
    written = beside if calibrate else None
    read = beside if beside is not None and beside.exists() and not calibrate else None
    ensure_outputs_distinct([("--out", out), ("--timeline", timeline), ("the calibration --calibrate writes", written)],
                            [("plan", plan_path), ("profile", prof), ("machine file", machine_file), ("calibration", read)])


def _check_calibration_writable(plan: Any, plan_path: Path, profile: Path | None) -> None:
    """--calibrate writes beside the profile at the end of the run: refuse an unwritable place now."""
    from planner.atomic import ensure_writable_file
    from planner.calibration import calibration_path_for
    from planner.plan import resolve_profile_path

    path = resolve_profile_path(plan, str(plan_path), str(profile) if profile else None)
    if path is not None:  # no profile: run_plan refuses --calibrate with its own message
        ensure_writable_file(calibration_path_for(path), "calibration")


def register(app: typer.Typer) -> None:
    app.command("run")(run)


def run(
    plan: PlanArgument,
    steps: Steps = 10, warmup: Warmup = None, lr: Lr = 1e-3, out: RunOut = None, timeline: RunTimeline = None,
    profile: RunProfile = None, device: RunDevice = "auto",
    calibrate: Annotated[bool, typer.Option(
        "--calibrate/--no-calibrate", help="Fit a calibration beside the profile from this run.")] = False,
    checkpoint_dir: CheckpointDir = None, checkpoint_every: CheckpointEvery = 0, timeout: Timeout = 300.0,
    threads: RankThreads = 0, runtime: Runtime = "torch", force: Force = False, verbose: Verbose = False,
    json_out: RunJson = False, model: VouchModel = None, trust_model: TrustModel = False,
    input_shape: RunInputShape = None, input_dtype: RunInputDtype = None, vocab: RunVocab = None,
    machine_file: Annotated[Optional[Path], typer.Option(
        "--machine-file", help="Machine file from `pplan calibrate --machine` to predict with when the profile has "
        "no calibration (default: $PPLAN_MACHINE, else ~/.cache/pplan/machine.json); where it has one, that one "
        "wins and the run warns that this file was not used.")] = None,
) -> None:
    """Train PLAN with torch.distributed.pipelining (one process per device, or under torchrun) and compare with the prediction.

    A plan whose model is a module:factory runs only with --model SPEC (the same string) or --trust-model:
    the factory is Python code the plan file names.
    """
    run_command(plan, steps=steps, warmup=warmup, lr=lr, out=out, timeline=timeline, profile=profile, device=device,
                calibrate=calibrate, checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every, timeout=timeout,
                threads=threads, runtime=runtime, force=force, verbose=verbose, json_out=json_out,
                model=model, trust_model=trust_model, input_shape=input_shape, input_dtype=input_dtype, vocab=vocab,
                machine_file=machine_file)
