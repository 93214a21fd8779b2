"""A benchmark's result table and its files: CSV and Markdown, both headed by the machine.

Every bench returns one or more Tables; `write_table` writes `<out_dir>/<name>.csv` and
`<name>.md` atomically (an interrupted bench leaves the previous files, never half of one).
Numbers are stored as measured; rounding happens only when formatting for people.
"""

from __future__ import annotations

import csv
import io
import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from planner.atomic import atomic_write_text
from planner.errors import PplanError
from planner.jsonio import MAX_JSON_BYTES, read_bounded_text
from planner.units import plain_float, plain_int

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["Table", "column", "format_cell", "machine_line", "read_table_csv", "table_csv", "table_markdown", "table_text",
           "write_table"]


@dataclass(frozen=True)
class Table:
    """Rows measured side by side in one run, with what a reader needs to interpret them."""

    name: str
    """File stem under the output folder (planner, simulator, quality, ...)."""
    title: str
    """One-line heading."""
    columns: tuple[str, ...]
    """Column names (also the CSV header)."""
    rows: tuple[tuple[Any, ...], ...]
    """One tuple per row, in column order; None prints as '-'."""
    notes: tuple[str, ...] = ()
    """Sentences printed under the table (method, limits, what a blank cell means)."""
    summary: dict[str, Any] = field(default_factory=dict)
    """Headline figures (MAPE, where ILP stops being practical ...) for --json and the docs."""
    terminal_columns: tuple[str, ...] = ()
    """The columns `pplan bench` prints, in this order (empty: every column): a wide table's
    terminal view. The CSV, Markdown and JSON keep every column."""

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "title": self.title, "columns": list(self.columns),
                "rows": [[_jsonable(v) for v in r] for r in self.rows], "notes": list(self.notes),
                "summary": {k: _jsonable(v) for k, v in self.summary.items()}}

    def to_frame(self) -> "pd.DataFrame":
        """The rows as a pandas DataFrame with the table's columns (numbers as measured, None kept
        as missing), for your own analysis; pandas is imported here only."""
        import pandas as pd

        return pd.DataFrame([list(r) for r in self.rows], columns=list(self.columns))


def _jsonable(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def format_cell(v: Any) -> str:
    """People's rendering: 4 significant digits, thousands separators for big numbers."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if not math.isfinite(v):
            return "-"
        if abs(v) >= 1e5:
            return f"{v:,.0f}"
        if abs(v) >= 100:
            return f"{v:.1f}"
        return f"{v:.4g}"
    if isinstance(v, int):
        return f"{v:,}" if abs(v) >= 1e5 else str(v)
    return str(v)


def _grid(table: Table) -> list[list[str]]:
    return [list(table.columns)] + [[format_cell(v) for v in row] for row in table.rows]


def table_text(table: Table, columns: Sequence[str] | None = None) -> str:
    """Aligned plain-text table for the terminal (text left, numbers right); `columns`: only these,
    in this order (None: every column)."""
    if columns is not None:
        keep = [table.columns.index(c) for c in columns]
        table = replace(table, columns=tuple(columns), rows=tuple(tuple(r[i] for i in keep) for r in table.rows))
    grid = _grid(table)
    widths = [max(len(r[i]) for r in grid) for i in range(len(table.columns))]
    numeric = [all(isinstance(row[i], (int, float)) or row[i] is None for row in table.rows) for i in range(len(table.columns))]
    lines = [table.title]
    for k, row in enumerate(grid):
        cells = [c.rjust(w) if numeric[i] and k else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
        lines.append("  ".join(cells).rstrip())
    lines.extend(f"note: {n}" for n in table.notes)
    return "\n".join(lines) + "\n"


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|")


def table_markdown(table: Table, machine: dict[str, Any]) -> str:
    """Markdown: title, machine, the table, notes."""
    out = [f"# {table.title}", "", machine_line(machine), ""]
    grid = _grid(table)
    out.append("| " + " | ".join(_md_escape(c) for c in grid[0]) + " |")
    out.append("|" + "|".join("---" for _ in grid[0]) + "|")
    out.extend("| " + " | ".join(_md_escape(c) for c in row) + " |" for row in grid[1:])
    if table.notes:
        out.append("")
        out.extend(f"- {n}" for n in table.notes)
    out.append("")
    return "\n".join(out)


def machine_line(machine: dict[str, Any]) -> str:
    """'Measured on ...' sentence for documents: one line, the machine as the CSV's header has it."""
    return (f"Measured {machine.get('date', '?')} on {machine.get('cpu', '?')} "
            f"({machine.get('cores', '?')} cores, {machine.get('ram_gib', '?')} GiB RAM, load {machine.get('load_1min', '?')}), "
            f"{machine.get('os', '?')}, Python {machine.get('python', '?')}, torch {machine.get('torch', '?')}, "
            f"numpy {machine.get('numpy', '?')}, PuLP {machine.get('pulp', '?')}, ILP solver {machine.get('ilp_solver', '?')}.")


def table_csv(table: Table, machine: dict[str, Any]) -> str:
    """CSV with the machine as leading `# key: value` lines (the profile format's convention)."""
    out = io.StringIO()
    for key, value in machine.items():
        out.write(f"# {key}: {value}\n")
    w = csv.writer(out, lineterminator="\n")
    w.writerow(table.columns)
    for row in table.rows:
        w.writerow(["" if v is None else (repr(v) if isinstance(v, float) else v) for v in row])
    return out.getvalue()


def _csv_value(text: str) -> Any:
    """A CSV cell as table_csv wrote it: '' is None, then a plain ASCII int, float, else the text
    (planner.units: '1_0' and other digits stay text, as the profile reader refuses them)."""
    if text == "":
        return None
    for kind in (plain_int, plain_float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def read_table_csv(path: str | os.PathLike, name: str, title: str) -> tuple[Table, dict[str, str]]:
    """(the table, the machine) from a CSV that table_csv wrote: a committed report redrawn
    without rerunning its bench. Notes and summary are not in the CSV: the table has none.
    Read bounded, as every file pplan opens (planner.jsonio)."""
    text = read_bounded_text(path, "bench table", PplanError, MAX_JSON_BYTES)
    machine: dict[str, str] = {}
    lines = text.splitlines(keepends=True)
    lead = 0
    while lead < len(lines) and lines[lead].startswith("# "):  # the machine's lines lead
        key, _, value = lines[lead][2:].rstrip("\r\n").partition(": ")
        machine[key] = value
        lead += 1
    records = list(csv.reader(io.StringIO("".join(lines[lead:]))))  # a quoted cell may hold a line break
    if not records:
        raise PplanError(f"{str(path)!r} has no table under its machine lines", "give a CSV that `pplan bench` wrote")
    rows = tuple(tuple(_csv_value(v) for v in r) for r in records[1:])
    return Table(name=name, title=title, columns=tuple(records[0]), rows=rows), machine


def write_table(table: Table, out_dir: str | os.PathLike, machine: dict[str, Any]) -> list[Path]:
    """Write `<out_dir>/<name>.csv` and `.md` atomically; returns the paths."""
    d = Path(out_dir)
    paths = [d / f"{table.name}.csv", d / f"{table.name}.md"]
    atomic_write_text(paths[0], table_csv(table, machine))
    atomic_write_text(paths[1], table_markdown(table, machine))
    return paths



def column(table: Table, name: str) -> list[Any]:
    """One column's values."""
    i = table.columns.index(name)
    return [r[i] for r in table.rows]
