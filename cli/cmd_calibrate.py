"""`pplan calibrate PLAN.json`: `pplan run --calibrate`, or a fit from an existing run (--from-run)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from cli.cmd_run import run_command
from cli.run_options import (
    CheckpointDir, CheckpointEvery, Lr, RankThreads, RunDevice, RunInputDtype, RunInputShape, RunJson,
    RunProfile, RunTimeline, RunVocab, Runtime, Steps, Timeout, TrustModel, Verbose, VouchModel, Warmup,
)
from cli.common import check_input_file, check_plan_inputs, echo_json, given_params, plan_inputs

if TYPE_CHECKING:
    from typer.core import TyperArgument, TyperOption

    from planner.execute.calibrate import Refit

__all__ = ["register"]


def _from_run(plan_path: Path, run_path: Path, profile: Path | None, force: bool, json_out: bool) -> None:
    """Fit from a run JSON already on disk and write the calibration beside the profile."""
    from planner.atomic import ensure_outputs_distinct
    from planner.calibration import calibration_path_for
    from planner.execute.calibrate import refit_from_run_file

    check_plan_inputs(plan_path, profile)
    check_input_file(run_path, "run", "run",
                     make="give the run JSON that `pplan run PLAN.json --out RUN.json` wrote, or drop --from-run to run the plan")
    # the calibration this replaces is not an input here: it is what the fit rewrites
    inputs = [(what, path) for what, path in plan_inputs(plan_path, profile) if what != "calibration"]
    prof = dict(inputs)["profile"]
    ensure_outputs_distinct([("the calibration file", calibration_path_for(prof) if prof else None)],
                            [*inputs, ("run JSON (--from-run)", run_path)])
    refit = refit_from_run_file(plan_path, run_path, profile, force=force)
    cal, fit = refit.calibration, refit.fit
    if json_out:
        echo_json({**{k: v for k, v in fit.to_dict().items() if k != "calibration"},  # the values are in the file
                   "calibration_before": refit.replaced, "calibration_before_from_run": refit.from_run,
                   "run_error_pct": refit.run_error_pct,
                   "run_prediction_source": refit.run_prediction_source})
    else:
        typer.echo(f"compute_scale {cal.compute_scale:.3f}, action_overhead {cal.action_overhead_ms:.3f} ms, "
                   f"step_overhead {cal.step_overhead_ms:.3f} ms")
        typer.echo(_error_line(refit, run_path))
        typer.echo(f"wrote {fit.path}")


def _error_line(refit: Refit, run_path: Path) -> str:
    """The error before and after, "before" named: with the calibration the fit replaces, else
    the one the run recorded, else uncalibrated; and the run's own recorded error beside it when that reads otherwise (the run
    predicted with another calibration, or a machine file), so two numbers are never left unexplained."""
    def pct(x: float | None) -> str:
        return "n/a" if x is None else f"{x:+.1f}%"

    fit = refit.fit
    if refit.replaced is not None:
        basis = f"with {refit.replaced}, the calibration this fit replaces"
    elif refit.from_run:
        basis = "with the calibration the run recorded, as no calibration was beside the profile"
    else:
        basis = "uncalibrated: no calibration was beside the profile, nor in the run"
    before, own = pct(fit.error_pct_before), pct(refit.run_error_pct)
    if refit.run_error_pct is None:
        ran = "; the run recorded no prediction of its own"
    elif own == before:
        ran = "; the same as the run's own prediction"
    else:
        ran = f"; the run's own prediction, {refit.run_prediction_source or 'as recorded'}, was {own}"
    return f"prediction error on {run_path}: before {before} ({basis}{ran}), after {pct(fit.error_pct_after)}"


def _machine(out: Path | None, ranks: str, threads: int, quick: bool, json_out: bool) -> None:
    """Measure this machine once per rank count (planner.execute.machinebench) and save the machine
    file, keeping the entries it already has for other counts. Every option is checked first: the
    bench takes minutes, and a --threads it refused after starting wasted them."""
    from planner.execute.machinebench import parse_rank_counts, remeasure_machine_file
    from planner.execute.preflight import cpu_rank_cap
    from planner.profiling.options import check_threads

    target = _machine_target(out)
    counts = parse_rank_counts(ranks, cpu_rank_cap())
    check_threads(threads, zero="0: cores / ranks")
    machines, path = remeasure_machine_file(target, counts, threads=threads or None, quick=quick,
                                            progress=lambda line: typer.echo(f"  {line}", err=True),
                                            warn=lambda line: typer.echo(f"pplan: warning: {line}", err=True))
    if json_out:
        echo_json(dict(machines.to_dict(), path=str(path)))
        return
    for m in machines.entries:
        new = " (measured now)" if m.ranks in counts else ""
        typer.echo(f"{m.ranks} processes x {m.threads} thread(s), {m.backend}, load {m.measured.get('load_average')}{new}: "
                   f"action overhead {m.action_overhead_ms:.3f} ms, hand-over latency {m.comm_latency_ms:.3f} ms, "
                   f"bandwidth {m.comm_bandwidth_bytes_per_s / 1e9:.2f} GB/s, step overhead {m.step_overhead_ms:.2f} ms")
        if m.ranks in counts:
            typer.echo("  optimizer ms/MiB: " + ", ".join(f"{k} {v:.3f}" for k, v in m.optimizer_ms_per_mib.items())
                       + (f"; compute with {m.ranks} ranks busy {m.concurrent_compute_ratio:.2f}x alone"
                          if m.concurrent_compute_ratio else "")
                       + (f"; a hand-over while every core computes costs each rank {m.handover_cpu_ms:.3f} ms"
                          f" + {m.handover_cpu_ms_per_mib or 0.0:.3f} ms/MiB" if m.handover_cpu_ms is not None else ""))
    typer.echo(f"wrote {path} (a plan is predicted with the entry for its process count, else the nearest)")


def _machine_target(out: Path | None) -> Path:
    """--out, else the machine file `pplan run` reads when given none (configured_machine_path:
    $PPLAN_MACHINE, else the default location)."""
    from planner.errors import PplanError
    from planner.machine import configured_machine_path

    if out is not None:
        if out.suffix.lower() != ".json":  # as partition, simulate and run ask of their JSON
            raise PplanError(f"--out {str(out)[:80]!r} must end in .json (the machine file is JSON)",
                             "e.g. --out machine.json")
        return out
    target = configured_machine_path()
    if target is None:  # writing elsewhere would make a file `pplan run` then ignores
        raise PplanError(f"PPLAN_MACHINE={os.environ.get('PPLAN_MACHINE', '')[:20]!r} turns the machine file off, "
                         "so `pplan run` reads none and calibrate --machine has no default file to write",
                         "give --out FILE.json (and `pplan run --machine-file FILE.json`), or set PPLAN_MACHINE to "
                         "the file to write, or unset it for ~/.cache/pplan/machine.json")
    return target


_MODE_PARAMS = {
    "--machine": ("machine", "ranks", "quick", "threads", "out", "json_out"),
    "--from-run": ("plan", "from_run", "profile", "force", "json_out"),
    "run": ("plan", "steps", "warmup", "lr", "out", "timeline", "profile", "device", "checkpoint_dir", "checkpoint_every",
            "timeout", "threads", "runtime", "force", "verbose", "json_out", "model", "trust_model", "input_shape",
            "input_dtype", "vocab"),
}
"""The parameters each way of calibrating reads: --machine measures with runs of its own (no plan);
--from-run fits a run already made (nothing runs); a plan alone is run as `pplan run --calibrate`."""
_MODE_WORDS = {"--machine": "with --machine (it measures the machine with runs of its own, no plan)",
               "--from-run": "with --from-run (no run is made; the calibration is written beside the profile)",
               "run": "when a plan is run (no --machine or --from-run)"}


def _refuse_unused(ctx: typer.Context, mode: str) -> None:
    """Refuse every option given on the command line that `mode` never reads (like `pplan
    partition`'s modes): a silently ignored --steps or --timeline looks as if it took effect.
    A flag given at its default value counts too (cli.common.given_params)."""
    from planner.errors import PplanError

    given_names = given_params(ctx)
    unused = [p for p in ctx.command.params if p.name in given_names and p.name not in _MODE_PARAMS[mode]]
    if not unused:
        return
    given = ", ".join(_shown(p, ctx.params.get(p.name)) for p in unused)
    users = [f"{_flag(p)} is another way to calibrate" if p.name in ("machine", "from_run") else
             f"{_flag(p)} goes with " + " or ".join(m if m != "run" else "a plan run"
                                                    for m, names in _MODE_PARAMS.items() if p.name in names)
             for p in unused]
    raise PplanError(f"{given}: not used {_MODE_WORDS[mode]}",
                     f"drop {'it' if len(unused) == 1 else 'them'} ({'; '.join(users)})")


def _flag(param: TyperOption | TyperArgument) -> str:
    """The name a user typed: the long flag, or PLAN for the argument."""
    return "PLAN" if param.param_type_name == "argument" else max(param.opts, key=len)


def _shown(param: TyperOption | TyperArgument, value: object) -> str:
    """The flag with the value given (a switch alone)."""
    if isinstance(value, bool):
        return _flag(param)
    return f"{_flag(param)} {value if isinstance(value, (int, float)) else repr(str(value)[:60])}"


def register(app: typer.Typer) -> None:
    app.command("calibrate")(calibrate)


def calibrate(
    ctx: typer.Context,
    plan: Annotated[Path | None, typer.Argument(
        metavar="PLAN.json", help="Plan JSON to run (or that --from-run ran); not with --machine.")] = None,
    from_run: Annotated[Path | None, typer.Option("--from-run", help="Fit from this run JSON instead of running.")] = None,
    machine: Annotated[bool, typer.Option(
        "--machine", help="Measure this machine once (per-action, hand-over, "
        "optimizer costs) and write a machine file (default: the one `pplan run` reads, $PPLAN_MACHINE, "
        "else ~/.cache/pplan/machine.json).")] = False,
    ranks: Annotated[str, typer.Option(
        "--ranks", help="With --machine: process counts to measure, comma-separated "
        "(one entry each; the file's entries for other counts are kept).")] = "2,4,8",
    quick: Annotated[bool, typer.Option("--quick", help="With --machine: fewer cases (about half the time).")] = False,
    steps: Steps = 10, warmup: Warmup = None, lr: Lr = 1e-3,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Run JSON to write (measured vs predicted); with --machine, the machine file to write or update (.json; default $PPLAN_MACHINE, else ~/.cache/pplan/machine.json, as `pplan run` reads; any other existing file is refused).")] = None, timeline: RunTimeline = None,
    profile: RunProfile = None, device: RunDevice = "auto",
    checkpoint_dir: CheckpointDir = None, checkpoint_every: CheckpointEvery = 0, timeout: Timeout = 300.0,
    threads: RankThreads = 0, runtime: Runtime = "torch",
    force: Annotated[bool, typer.Option("--force", help="Run despite a changed profile or more CPU ranks than the "
                                        "machine sensibly runs; with --from-run, fit on a profile other than the "
                                        "plan's.")] = False, verbose: Verbose = False,
    json_out: RunJson = False, model: VouchModel = None, trust_model: TrustModel = False,
    input_shape: RunInputShape = None, input_dtype: RunInputDtype = None, vocab: RunVocab = None,
) -> None:
    """Run PLAN and fit what the profile cannot see (same as `pplan run --calibrate`); writes it beside the profile.

    As with `pplan run`, a module:factory model runs only with --model SPEC (the same string) or --trust-model.
    `pplan calibrate --machine [--out FILE]` instead measures the machine once (no plan). Each way
    refuses the options it does not read.
    """
    from planner.errors import PplanError

    mode = "--machine" if machine else "--from-run" if from_run is not None else "run"
    _refuse_unused(ctx, mode)
    if machine:
        _machine(out, ranks, threads, quick, json_out)
        return
    if plan is None:
        raise PplanError("no PLAN.json given to calibrate",
                         "give the plan to run (`pplan calibrate PLAN.json`; with --from-run, the plan that run ran), "
                         "or --machine to measure this machine")
    if from_run is not None:
        _from_run(plan, from_run, profile, force, json_out)
        return
    run_command(plan, steps=steps, warmup=warmup, lr=lr, out=out, timeline=timeline, profile=profile, device=device,
                calibrate=True, checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every, timeout=timeout,
                threads=threads, runtime=runtime, force=force, verbose=verbose, json_out=json_out,
                model=model, trust_model=trust_model, input_shape=input_shape, input_dtype=input_dtype, vocab=vocab)
