"""`pplan demo`: profile, partition, simulate, run, calibrate and report a built-in gpt on this CPU."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cli.common import echo_json, err

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)


def demo(
    out_dir: Annotated[Path, typer.Option("--out-dir", help="Report folder (default reports/demo); inputs go to OUT_DIR/data/.")] = Path("reports/demo"),
    quick: Annotated[bool, typer.Option("--quick", help="A smaller model and fewer steps (for tests, well under a minute).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the results as JSON instead of a summary.")] = False,
) -> None:
    """The whole pipeline in one command, on CPU, in about a minute; writes reports/demo/.

    (73 s measured on a loaded 2-core machine; a busier one takes up to about two minutes.)

    Profiles a gpt with a large vocabulary, chooses a memory limit that the equal-layer split
    cannot meet, partitions it over 2 devices, simulates, runs it (one process per device),
    calibrates the simulator on that run, re-plans, runs again, runs the equal-layer split for
    comparison, and writes a report. Progress goes to stderr; the numbers that matter to stdout.
    """
    from planner.demo import run_demo

    result = run_demo(out_dir, quick=quick, say=err)
    if as_json:
        import json

        echo_json(json.loads((result.out_dir / "data" / "demo.json").read_text(encoding="utf-8")))
        return
    minutes, seconds = divmod(int(round(result.elapsed_s)), 60)
    typer.echo(f"pplan demo finished in {minutes}m{seconds:02d}s")
    typer.echo(f"report: {result.html}  (also {result.out_dir / 'report.md'}; inputs in {result.out_dir / 'data'})")
    for key, value in result.summary():
        typer.echo(f"  {key}: {value}")
