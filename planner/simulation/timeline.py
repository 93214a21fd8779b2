"""Timeline CSV output: device,stage,kind,microbatch,start_ms,end_ms (docs/HELPERS.md format).

Reading timelines (simulated or measured) lives with the report (planner.report.inputs).
"""

from __future__ import annotations

import csv
import io
import os
from typing import Iterable

from planner.atomic import atomic_write_text
from planner.simulation.result import TIMELINE_COLUMNS

__all__ = ["timeline_csv_text", "write_timeline"]


def timeline_csv_text(rows: Iterable) -> str:
    """CSV text of timeline rows (objects with the TIMELINE_COLUMNS attributes), times to 1 ns."""
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(TIMELINE_COLUMNS)
    for r in rows:
        w.writerow([int(r.device), int(r.stage), r.kind, int(r.microbatch), f"{r.start_ms:.6f}", f"{r.end_ms:.6f}"])
    return out.getvalue()


def write_timeline(rows: Iterable, path: str | os.PathLike) -> None:
    """Write the timeline CSV atomically."""
    atomic_write_text(path, timeline_csv_text(rows))
