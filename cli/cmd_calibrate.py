"""`pplan calibrate PLAN.json`: `pplan run --calibrate`, or a fit from an existing run (--from-run)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from cli.cmd_run import run_command, run_options
from cli.common import echo_json

__all__ = ["register"]


def _from_run(plan_path: Path, run_path: Path, profile: Path | None, json_out: bool) -> None:
    from planner.calibration import calibration_path_for, find_calibration, write_calibration
    from planner.errors import PplanError
    from planner.execute.calibrate import fit_calibration
    from planner.execute.preflight import resolve_profile_path
    from planner.plan import load_plan
    from planner.profiling.profile import load_profile

    plan = load_plan(plan_path)
    try:
        run = json.loads(run_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise PplanError(f"cannot read run {str(run_path)!r} ({e})", "give the JSON that `pplan run --out` wrote") from None
    if not isinstance(run, dict) or "iteration_ms_measured" not in run or "ranks" not in run:
        raise PplanError(f"{run_path} is not a run JSON", "give the JSON that `pplan run --out` wrote")
    path = resolve_profile_path(plan, str(plan_path), str(profile) if profile else None)
    if path is None:
        raise PplanError("the plan names no profile", "pass --profile PROFILE.csv")
    prof = load_profile(path)
    cal, report = fit_calibration(run, plan, prof, previous=find_calibration(prof.path), run_path=str(run_path))
    target = calibration_path_for(prof.path)
    write_calibration(cal, target)
    report["path"] = str(target)
    if json_out:
        echo_json(report)
    else:
        typer.echo(f"compute_scale {cal.compute_scale:.3f}, action_overhead {cal.action_overhead_ms:.3f} ms, "
                   f"step_overhead {cal.step_overhead_ms:.3f} ms")
        typer.echo(f"prediction error on {run_path}: before {report['error_pct_before']:+.1f}%, after {report['error_pct_after']:+.1f}%")
        typer.echo(f"wrote {target}")


def register(app: typer.Typer) -> None:
    o = run_options(True)

    @app.command("calibrate")
    def calibrate(
        plan: Path = typer.Argument(..., help="Plan JSON to run (or that --from-run ran)."),
        from_run: Path | None = typer.Option(None, "--from-run", help="Fit from this run JSON instead of running."),
        steps: int = o["steps"], warmup: int = o["warmup"], lr: float = o["lr"], out: Path | None = o["out"],
        timeline: Path | None = o["timeline"], profile: Path | None = o["profile"], device: str = o["device"],
        checkpoint_dir: Path | None = o["checkpoint_dir"], checkpoint_every: int = o["checkpoint_every"],
        timeout: float = o["timeout"], threads: int = o["threads"], runtime: str = o["runtime"],
        force: bool = o["force"], verbose: bool = o["verbose"], json_out: bool = o["json_out"],
    ) -> None:
        """Run PLAN and fit what the profile cannot see (same as `pplan run --calibrate`); writes it beside the profile."""
        if from_run is not None:
            _from_run(plan, from_run, profile, json_out)
            return
        run_command(plan, steps=steps, warmup=warmup, lr=lr, out=out, timeline=timeline, profile=profile, device=device,
                    calibrate=True, checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every, timeout=timeout,
                    threads=threads, runtime=runtime, force=force, verbose=verbose, json_out=json_out)
