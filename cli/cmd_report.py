"""`pplan report`: figures and an index (report.md, self-contained report.html) from whatever exists."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from cli.common import check_calibration_input, check_input_file, check_plan_inputs, echo_json, err

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    app.command("report")(report)


def report(
    profile: Annotated[Optional[Path], typer.Option("--profile", help="Profile CSV (per-layer figure, sweep, simulation).")] = None,
    plan: Annotated[Optional[Path], typer.Option("--plan", help="Plan JSON from `pplan partition`.")] = None,
    sim: Annotated[Optional[Path], typer.Option("--sim", help="Simulation JSON from `pplan simulate`.")] = None,
    run: Annotated[Optional[Path], typer.Option("--run", help="Run JSON from `pplan run`.")] = None,
    timeline: Annotated[Optional[Path], typer.Option("--timeline", help="Simulated timeline CSV.")] = None,
    measured_timeline: Annotated[Optional[Path], typer.Option("--measured-timeline", help="Measured timeline CSV from `pplan run`.")] = None,
    calibration: Annotated[Optional[str], typer.Option("--calibration", help="Calibration JSON for what the report simulates, or 'none' (default: the profile's own, if any).")] = None,
    name: Annotated[Optional[str], typer.Option("--name", help="Write reports/NAME/ (default reports/latest/).")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Write to this folder instead of reports/NAME/.")] = None,
    formats: Annotated[str, typer.Option("--formats", help="Figure files to write: comma list of png, svg, pdf.")] = "png,svg",
    title: Annotated[Optional[str], typer.Option("--title", help="Title of the report page.")] = None,
    no_simulate: Annotated[bool, typer.Option("--no-simulate", help="Only draw from the given files; never simulate here.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print what was written as JSON.")] = False,
) -> None:
    """Write reports/NAME/ with PNG/SVG figures, report.md and a self-contained report.html.

    Every input is optional: a figure whose inputs are missing is skipped, and the index says
    which file would add it. With --plan and --profile, the plan is simulated here when no
    --sim/--timeline is given, and micro-batch counts and schedules are swept.
    """
    from planner.report import build_report, load_inputs, parse_formats, report_dir
    from planner.report.build import check_report_dir
    from planner.report.document import check_replaceable

    fmts = parse_formats(formats)
    _check_inputs_exist(profile, plan, sim, run, timeline, measured_timeline, calibration)
    out_dir = report_dir(name, out)
    check_report_dir(out_dir)  # before reading or simulating anything
    _check_inputs_outside(out_dir, {"--profile": profile, "--plan": plan, "--sim": sim, "--run": run,
                                    "--timeline": timeline, "--measured-timeline": measured_timeline,
                                    "--calibration": None if calibration is None or calibration.strip().lower() == "none"
                                    else Path(calibration)})
    check_replaceable(out_dir)  # someone's own figures/ or report.md is never replaced
    inputs = load_inputs(profile=profile, plan=plan, sim=sim, run=run, timeline=timeline,
                         measured_timeline=measured_timeline, calibration=calibration)
    result = build_report(inputs, out_dir, formats=fmts, title=title, simulate=not no_simulate,
                          progress=None if as_json else err)
    if as_json:
        echo_json({
            "out_dir": str(result.out_dir),
            "markdown": str(result.markdown),
            "html": str(result.html),
            "figures": [{"number": f.number, "key": f.key, "title": f.title, "files": list(f.files),
                         "skipped": f.skipped} for f in result.figures],
            "summary": [{"quantity": k, "value": v} for k, v in result.summary],
        })
        return
    drawn = [f for f in result.figures if not f.skipped]
    typer.echo(f"report: {result.html}  ({len(drawn)} of {len(result.figures)} figures)")
    for f in result.figures:
        if f.skipped:
            typer.echo(f"  skipped figure {f.number} ({f.title.lower()}): {f.skipped}")
    for key, value in result.summary:
        typer.echo(f"  {key}: {value}")


def _check_inputs_exist(profile: Optional[Path], plan: Optional[Path], sim: Optional[Path], run: Optional[Path],
                        timeline: Optional[Path], measured_timeline: Optional[Path], calibration: Optional[str]) -> None:
    """Refuse, with what to give instead, a folder given for an input file, and a missing output of
    another command with the command that writes it (the profile's and plan's readers say so themselves)."""
    check_plan_inputs(plan, profile)
    check_input_file(sim, "simulation", "sim", make="write one with `pplan simulate PLAN.json --out SIM.json`")
    check_input_file(run, "run", "run", make="write one with `pplan run PLAN.json --out RUN.json`")
    check_input_file(timeline, "timeline", "timeline", make="write one with `pplan simulate PLAN.json --timeline FILE.csv`")
    check_input_file(measured_timeline, "measured timeline", "timeline",
                     make="write one with `pplan run PLAN.json --timeline FILE.csv`")
    check_calibration_input(calibration)


def _check_inputs_outside(out_dir: Path, inputs: dict[str, Optional[Path]]) -> None:
    """Refuse an input the report would replace: the folder's figures/ is swapped for a new one
    as a whole, and report.md and report.html are rewritten."""
    from planner.atomic import ensure_outputs_distinct
    from planner.errors import PplanError
    from planner.report.document import FIGURES_DIR

    figures = _resolved(out_dir / FIGURES_DIR)
    for flag, path in inputs.items():
        if path is not None and _resolved(path).is_relative_to(figures):
            raise PplanError(f"{flag} {str(path)!r} is inside {str(out_dir / FIGURES_DIR)!r}, which the report replaces",
                             "move it out of the report folder's figures/, or choose another --out")
    ensure_outputs_distinct([("report page", out_dir / "report.html"), ("report text", out_dir / "report.md")],
                            [(f"{flag} file", path) for flag, path in inputs.items()])


def _resolved(path: Path) -> Path:
    """`path` absolute with its links followed as far as they lead; never raises: Path.resolve()
    raises RuntimeError on a symlink loop (Python 3.11), which names no file, and the reader then
    says so on one line."""
    return Path(os.path.realpath(path))
