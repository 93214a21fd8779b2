"""Build a report folder from whatever inputs exist: figures, report.md, report.html."""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from planner.errors import PplanError
from planner.report import (
    fig_accuracy, fig_baselines, fig_memory, fig_profile, fig_schedule, fig_sweep,
)
from planner.report.derive import derive, without_simulation
from planner.report.document import (
    FIGURES_DIR, FigureEntry, ReportDocument, render_html, render_markdown, write_report_folder,
)
from planner.report.inputs import ReportInputs
from planner.report.style import render, style_context
from planner.report.summary import key_numbers

__all__ = ["FIGURES", "FORMATS", "MAX_FIGURE_INCHES", "Report", "build_report", "check_report_dir", "parse_formats", "report_dir"]

# Figure modules in index order; each has KEY, TITLE, missing(), caption(), draw().
FIGURES: tuple[ModuleType, ...] = (fig_schedule, fig_memory, fig_sweep, fig_baselines, fig_profile, fig_accuracy)
FORMATS = ("png", "svg", "pdf")
# Widest and tallest figure, inches (6000 pixels at the report's 150 dpi). Figures grow with the
# devices they show; at the 4,000 a pipeline may have, a memory figure asked for 2,000 inches
# (0.8 GB of pixels once rendered).
MAX_FIGURE_INCHES = 40.0
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


@dataclass(frozen=True)
class Report:
    """What `build_report` wrote."""

    out_dir: Path
    """The report folder."""
    figures: tuple[FigureEntry, ...]
    """Every figure, drawn or skipped (with the reason)."""
    summary: tuple[tuple[str, str], ...]
    """The key numbers shown at the top."""

    @property
    def markdown(self) -> Path:
        """report.md."""
        return self.out_dir / "report.md"

    @property
    def html(self) -> Path:
        """report.html (self-contained)."""
        return self.out_dir / "report.html"


def parse_formats(text: str | None) -> tuple[str, ...]:
    """'png,svg' -> ('png', 'svg'); PplanError on anything else."""
    items = tuple(x.strip().lower() for x in (text or "png,svg").split(",") if x.strip())
    bad = [x for x in items if x not in FORMATS]
    if bad or not items:
        raise PplanError(f"unknown figure format(s) {', '.join(bad) or repr(text)}", f"use a comma list of {', '.join(FORMATS)}")
    return tuple(dict.fromkeys(items))


def report_dir(name: str | None = None, out: str | os.PathLike | None = None, root: str | os.PathLike = "reports") -> Path:
    """`--out` as given, else reports/NAME (NAME defaults to 'latest')."""
    if out is not None and name is not None:
        raise PplanError("give either --name or --out, not both")
    if out is not None:
        return Path(out)
    name = name or "latest"
    if not _NAME_RE.match(name):
        raise PplanError(f"report name {name!r} is not a plain folder name",
                         "use letters, digits, '.', '_' and '-', or pass --out PATH")
    return Path(root) / name


def check_report_dir(out_dir: str | os.PathLike) -> None:
    """Refuse, before any work, a report folder that could not be written at the end."""
    from planner.atomic import ensure_writable_dir

    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise PplanError(f"report folder {str(out)!r} exists and is a file", "choose another --out or --name")
    ensure_writable_dir(out, "report folder")


def build_report(
    inputs: ReportInputs,
    out_dir: str | os.PathLike,
    formats: tuple[str, ...] = ("png", "svg"),
    title: str | None = None,
    extra_summary: tuple[tuple[str, str], ...] = (),
    regenerate: str | None = None,
    simulate: bool = True,
    progress: Callable[[str], None] | None = None,
) -> Report:
    """Draw every figure the inputs allow and write the report folder atomically.

    With `simulate`, a plan + profile without simulation files is simulated here (and the
    micro-batch sweep is computed); otherwise only the given files are used.
    """
    say = progress or (lambda _msg: None)
    out = Path(out_dir)
    check_report_dir(out)  # before simulating and drawing
    derived = derive(inputs, say) if simulate else without_simulation(inputs)
    if derived.inputs is not None:
        inputs = derived.inputs
    entries: list[FigureEntry] = []
    files: dict[str, bytes] = {}
    with style_context():
        for number, module in enumerate(FIGURES, start=1):
            reason = module.missing(inputs, derived)
            if reason and module is fig_schedule and derived.timeline_skipped:  # simulated, but too long to draw
                reason = derived.timeline_skipped
            if reason:
                entries.append(FigureEntry(number, module.KEY, module.TITLE, "", skipped=reason))
                continue
            say(f"drawing figure {number}: {module.TITLE.lower()}")
            fig = _bounded(module.draw(inputs, derived))
            png = render(fig, "png")
            names = []
            for fmt in formats:
                data = png if fmt == "png" else render(fig, fmt)
                files[f"{module.KEY}.{fmt}"] = data
                names.append(f"{FIGURES_DIR}/{module.KEY}.{fmt}")
            entries.append(FigureEntry(number, module.KEY, module.TITLE, module.caption(inputs), tuple(names), png))
    calibration_warning = (derived.calibration_warning,) if derived.calibration_warning else ()
    summary = tuple(extra_summary) + tuple(key_numbers(inputs, fig_baselines.candidates(inputs, derived), calibration_warning))
    doc = ReportDocument(
        title=title or f"pplan report: {out.name}",
        inputs=tuple(sorted(inputs.sources.items())),
        summary=summary,
        figures=tuple(entries),
        notes=tuple(inputs.notes) + tuple(derived.notes),
        regenerate=regenerate or _regenerate_command(inputs, out, formats),
    )
    say(f"writing {out}")
    write_report_folder(out, files, render_markdown(doc), render_html(doc))
    return Report(out_dir=out, figures=tuple(entries), summary=summary)


def _bounded(fig: Any) -> Any:
    """`fig` shrunk, keeping what it draws, to at most MAX_FIGURE_INCHES on each side."""
    width, height = fig.get_size_inches()
    if max(width, height) > MAX_FIGURE_INCHES:
        fig.set_size_inches(min(width, MAX_FIGURE_INCHES), min(height, MAX_FIGURE_INCHES))
    return fig


def _regenerate_command(inputs: ReportInputs, out: Path, formats: tuple[str, ...]) -> str:
    flags = {"profile": "--profile", "plan": "--plan", "sim": "--sim", "run": "--run",
             "timeline": "--timeline", "measured_timeline": "--measured-timeline"}
    parts = ["pplan", "report"]
    for name, flag in flags.items():
        if name in inputs.sources:
            parts += [flag, inputs.sources[name]]
    parts += ["--out", str(out)]
    if formats != ("png", "svg"):
        parts += ["--formats", ",".join(formats)]
    return " ".join(shlex.quote(p) for p in parts)


