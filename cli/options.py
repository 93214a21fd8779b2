"""Command-line parameters that mean the same thing in several commands, declared once.

Every command declares every parameter one way, typer's `Annotated` form:
`name: Annotated[type, typer.Option("--flag", help=...)] = default`, the default in the
signature. `pplan run` and `pplan calibrate` share theirs through cli/run_options.py.

Each is an `Annotated` type: the Python type and the typer declaration (flag, metavar, help)
travel together, so a command writes `plan_path: PlanArgument` and every command that takes the
parameter shows the same help and parses it the same way. A parameter goes here only when its
meaning, and so its help text, is the same everywhere it is used; an option that merely shares
a flag name with another command's (`--profile` as an input of `report` and a default override
of `simulate`) stays in its command, with its own help.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

__all__ = ["PlanArgument", "CalibrationOption"]

PlanArgument = Annotated[Path, typer.Argument(
    metavar="PLAN.json", help="Plan JSON (from `pplan partition` or written by hand).")]
"""The plan a command reads: `simulate` and `run` (required, positional)."""

CalibrationOption = Annotated[Optional[str], typer.Option(
    "--calibration",
    help="Calibration JSON to apply, or 'none' (default: the profile's own, if `pplan calibrate` made one).")]
"""--calibration of the commands that price a plan from its profile (`simulate`, `partition`);
None: the profile's own, as planner.calibration.resolve_calibration finds it."""
