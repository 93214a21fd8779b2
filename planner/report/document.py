"""The report's index: report.md and a self-contained report.html, and the atomic folder write.

Everything is rendered in memory first, then written in full (fsynced) into a hidden staging
folder in the report folder. The last step moves the figures and the two index files into place, with
SIGINT, SIGTERM and SIGHUP held for those few renames: a failed or interrupted report leaves the
previous one (or nothing) as it was, or the complete new one, never an index beside figures of
another run. Only a folder that is new, empty, or a previous pplan report is written to
(check_replaceable): someone's own figures/ or report.md is refused, not replaced.
"""

from __future__ import annotations

import base64
import contextlib
import html
import os
import re
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from planner.atomic import stop_signals_held
from planner.errors import PplanError

__all__ = ["FigureEntry", "ReportDocument", "render_markdown", "render_html", "write_report_folder", "check_replaceable",
           "MAX_INDEX_BYTES"]

FIGURES_DIR = "figures"


@dataclass(frozen=True)
class FigureEntry:
    """One figure of the report: drawn (files + embedded PNG) or skipped (reason)."""

    number: int
    """Figure number in the index (1-based)."""
    key: str
    """File stem, e.g. '1_schedule'."""
    title: str
    """Heading."""
    caption: str
    """What it shows, one paragraph (may contain `code` spans)."""
    files: tuple[str, ...] = ()
    """Paths relative to the report folder, one per format written."""
    png: bytes | None = None
    """PNG bytes embedded in report.html."""
    skipped: str | None = None
    """Why it was not drawn (None when drawn)."""


@dataclass(frozen=True)
class ReportDocument:
    """The index content, independent of its rendering."""

    title: str
    """Page title."""
    inputs: tuple[tuple[str, str], ...]
    """(input name, file) rows."""
    summary: tuple[tuple[str, str], ...]
    """(quantity, value) rows of the key numbers."""
    figures: tuple[FigureEntry, ...]
    """Figures in order, drawn or skipped."""
    notes: tuple[str, ...] = ()
    """Extra remarks (what was computed here, warnings)."""
    regenerate: str | None = None
    """The command that rebuilds this report."""


def render_markdown(doc: ReportDocument) -> str:
    out = [f"# {doc.title}", ""]
    if doc.summary:
        out += ["## Key numbers", "", "| quantity | value |", "| --- | --- |"]
        out += [f"| {_md_cell(k)} | {_md_cell(v)} |" for k, v in doc.summary]
        out.append("")
    for fig in doc.figures:
        out.append(f"## Figure {fig.number}. {fig.title}")
        out.append("")
        if fig.skipped:
            out += [f"*Skipped: {fig.skipped}.*", ""]
            continue
        first = fig.files[0]
        image = next((f for f in fig.files if f.endswith(".png")), first)
        out += [f"![{fig.title}]({image})", "", fig.caption, ""]
        out += ["Files: " + ", ".join(f"[{Path(f).suffix[1:].upper()}]({f})" for f in fig.files), ""]
    out += ["## Inputs", "", "| input | file |", "| --- | --- |"]
    out += [f"| {name} | `{path}` |" for name, path in doc.inputs] or ["| (none) | |"]
    out.append("")
    for note in doc.notes:
        out += [f"- {note}"]
    if doc.notes:
        out.append("")
    if doc.regenerate:
        out += ["Regenerate with:", "", "```", doc.regenerate, "```", ""]
    return "\n".join(out)


def _md_cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _inline(text: str) -> str:
    """Escape for HTML, then turn `code` spans into <code>."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))


_CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;max-width:1180px;margin:24px auto;padding:0 16px;color:#222}
h1{font-size:24px;margin-bottom:8px}h2{font-size:18px;margin-top:32px;border-bottom:1px solid #ddd;padding-bottom:4px}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ddd;padding:4px 10px;text-align:left;font-size:14px}
th{background:#f4f4f4}img{max-width:100%;height:auto;border:1px solid #eee}p.caption{color:#444;font-size:14px}
p.skipped{color:#8a6d3b;background:#fcf8e3;padding:6px 10px;border-radius:4px}code{background:#f4f4f4;padding:0 3px}
p.files{font-size:13px}pre{background:#f4f4f4;padding:8px;overflow-x:auto}
""".strip()


def render_html(doc: ReportDocument) -> str:
    """A single self-contained page: figures embedded as base64 PNG, links to the files beside it."""
    esc = html.escape
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f"<title>{esc(doc.title)}</title>", f"<style>{_CSS}</style></head><body>", f"<h1>{esc(doc.title)}</h1>"]
    if doc.summary:
        out.append("<h2>Key numbers</h2><table><tr><th>quantity</th><th>value</th></tr>")
        out += [f"<tr><td>{_inline(k)}</td><td>{_inline(v)}</td></tr>" for k, v in doc.summary]
        out.append("</table>")
    for fig in doc.figures:
        out.append(f'<h2 id="{esc(fig.key)}">Figure {fig.number}. {esc(fig.title)}</h2>')
        if fig.skipped:
            out.append(f'<p class="skipped">Skipped: {_inline(fig.skipped)}.</p>')
            continue
        if fig.png is not None:
            data = base64.b64encode(fig.png).decode("ascii")
            out.append(f'<img alt="{esc(fig.title)}" src="data:image/png;base64,{data}">')
        out.append(f'<p class="caption">{_inline(fig.caption)}</p>')
        links = " · ".join(f'<a href="{esc(f)}">{esc(Path(f).suffix[1:].upper())}</a>' for f in fig.files)
        out.append(f'<p class="files">Files: {links}</p>')
    out.append("<h2>Inputs</h2><table><tr><th>input</th><th>file</th></tr>")
    out += [f"<tr><td>{esc(n)}</td><td><code>{esc(p)}</code></td></tr>" for n, p in doc.inputs]
    out.append("</table>")
    if doc.notes:
        out.append("<ul>" + "".join(f"<li>{_inline(n)}</li>" for n in doc.notes) + "</ul>")
    if doc.regenerate:
        out.append(f"<p>Regenerate with:</p><pre>{esc(doc.regenerate)}</pre>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


# What every index pplan writes holds (the inputs table of render_markdown and render_html): how a
# previous report is told from someone's own report.md or report.html, which the report overwrites.
_SIGNATURES = {"report.md": b"## Inputs\n\n| input | file |\n| --- | --- |\n",
               "report.html": b"<h2>Inputs</h2><table><tr><th>input</th><th>file</th></tr>"}
_FIGURE_FILE = re.compile(r"[0-9]{1,3}_[a-z0-9_]{1,60}\.(png|svg|pdf)")
"""The name of every file pplan writes under figures/ ('1_schedule.png'); anything else is not its."""
MAX_INDEX_BYTES = 256 * 2**20
"""Largest report.md or report.html read to recognise a previous report (the committed example's page,
six figures embedded, is 0.8 MB); a larger one is not taken for pplan's."""
_NOT_OURS_HINT = ("a report replaces the folder's figures/, report.md and report.html: give a new or empty folder "
                  "(--out, --name), or move those out of it")


def check_replaceable(out_dir: str | os.PathLike) -> None:
    """Refuse a report folder whose figures/, report.md or report.html pplan did not write: the report
    swaps figures/ for a new one as a whole and rewrites both index files, so only a new or empty
    folder, one without those three, or a previous pplan report (its index holds pplan's inputs table,
    figures/ only figure files) is written to. Other files in the folder are never touched, but
    for the hidden staging folders only the report writer names (_LEFTOVER)."""
    out = Path(out_dir)
    if not out.is_dir():
        return  # no folder yet (a file there is refused by the writer)
    for name, signature in _SIGNATURES.items():
        if os.path.lexists(out / name) and not _is_our_index(out / name, signature):
            raise PplanError(f"report folder {str(out)!r} holds a {name} that is not a pplan report, which the "
                             "report would overwrite", _NOT_OURS_HINT)
    figures = out / FIGURES_DIR
    if not os.path.lexists(figures):
        return
    if figures.is_symlink() or not figures.is_dir():
        raise PplanError(f"report folder {str(out)!r}: {FIGURES_DIR}/ is not a folder pplan wrote (a link or a file), "
                         "and the report replaces it", _NOT_OURS_HINT)
    with os.scandir(figures) as entries:
        for entry in entries:
            if not (_FIGURE_FILE.fullmatch(entry.name) and entry.is_file(follow_symlinks=False)):
                raise PplanError(f"report folder {str(out)!r}: {FIGURES_DIR}/{entry.name[:80]!r} is not a figure "
                                 "pplan wrote, and the report replaces figures/ as a whole", _NOT_OURS_HINT)


def _is_our_index(path: Path, signature: bytes) -> bool:
    """Whether `path` is a regular file of at most MAX_INDEX_BYTES holding pplan's inputs table."""
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_INDEX_BYTES:
            return False  # a FIFO would block the read; a folder or device is not a report
        with open(path, "rb") as f:
            return signature in f.read(MAX_INDEX_BYTES + 1)
    except (OSError, RuntimeError):  # unreadable, or a symlink loop
        return False


# A report being written is staged in '.report.k3x_9q2a.tmp/' (its figures/, report.html, report.md),
# and the previous figures/ leaves as '.figures.k3x_9q2a.old/'; earlier versions staged the figures
# alone in '.figures.k3x_9q2a.tmp/'. tempfile.mkdtemp makes these names: eight of [a-z0-9_] between
# the prefix and the suffix given (_STAGING, _OLD_FIGURES).
_STAGING = {"prefix": ".report.", "suffix": ".tmp"}
_OLD_FIGURES = {"prefix": f".{FIGURES_DIR}.", "suffix": ".old"}
_LEFTOVER = re.compile(r"\.(report|figures)\.[a-z0-9_]{8}\.(tmp|old)")
_INDEX_FILES = ("report.html", "report.md")


def write_report_folder(out_dir: str | os.PathLike, figure_files: dict[str, bytes], markdown: str, page: str) -> Path:
    """Write figures (names relative to `figures/`) and the two index files, atomically, into a folder
    that is new, empty or a previous pplan report (check_replaceable)."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise PplanError(f"report folder {str(out)!r} exists and is a file", "choose another --out or --name")
    check_replaceable(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise PplanError(f"cannot create report folder {str(out)!r}: {e.strerror}") from None
    try:
        _write_and_swap(out, figure_files, dict(zip(_INDEX_FILES, (page, markdown))))
    except OSError as e:  # a full disk, a folder made read-only meanwhile: the previous report is kept
        raise PplanError(f"cannot write report folder {str(out)!r}: {e.strerror or e}",
                         "free some space or choose another --out") from None
    _remove_leftovers(out)
    return out


def _write_and_swap(out: Path, figure_files: dict[str, bytes], index: dict[str, str]) -> None:
    """Write every file into a staging folder, then move the figures and the index files into place.
    Figures first: their swap is the step that can fail and be undone (a full disk refusing the
    previous figures/ a new name); the index files are then replaced in place."""
    staging = Path(tempfile.mkdtemp(dir=out, **_STAGING))
    final, old = out / FIGURES_DIR, None
    try:
        (staging / FIGURES_DIR).mkdir()
        for name, data in sorted(figure_files.items()):
            _write_synced(staging / FIGURES_DIR / name, data)
        for name, text in index.items():
            _write_synced(staging / name, text.encode("utf-8"))
        with stop_signals_held():
            if os.path.lexists(final):
                old = Path(tempfile.mkdtemp(dir=out, **_OLD_FIGURES))
                os.rmdir(old)  # a fresh name for the previous figures/ (a rename cannot put it into a folder)
                os.rename(final, old)
            os.rename(staging / FIGURES_DIR, final)
            for name in index:
                os.replace(staging / name, out / name)
    except BaseException:
        if old is not None and not os.path.lexists(final):
            with contextlib.suppress(OSError):
                os.rename(old, final)
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if old is not None and os.path.lexists(final):  # else the previous figures stay, under that name
            shutil.rmtree(old, ignore_errors=True)


def _write_synced(path: Path, data: bytes) -> None:
    """A new file holding `data`, on disk before any rename makes it part of the report."""
    with open(path, "xb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _remove_leftovers(out: Path) -> None:
    """Remove the staging and old figures folders of earlier reports that were killed (SIGKILL, a
    power cut) before they could. Safe by their names: only this writer gives them (mkdtemp's random
    part between its own prefix and suffix, hidden), and only in a folder that check_replaceable
    accepted as new, empty or a previous report, the output of one `pplan report` (any other file in
    it is left alone). A report writing the same folder at this moment would lose its staging
    folder; two reports into one folder at once already race for figures/ itself."""
    with os.scandir(out) as entries:
        leftovers = [e.path for e in entries if _LEFTOVER.fullmatch(e.name) and e.is_dir(follow_symlinks=False)]
    for path in leftovers:
        shutil.rmtree(path, ignore_errors=True)
