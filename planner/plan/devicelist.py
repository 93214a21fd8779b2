"""Which of a plan's devices a listing for people shows: every one up to LIST_ALL_UP_TO, else the
first and last few and the extremes (the slowest, the one with the most memory), with one line that
says how many were left out and where every device's numbers are.

A pipeline may have 4,000 devices (planner.plan.records.MAX_PIPELINE_STAGES): `pplan simulate` and
`pplan report` both list devices through this, so they leave out the same rows alike; the JSON and CSV
they write keep every device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

__all__ = ["LIST_ALL_UP_TO", "LIST_ENDS", "DeviceListing", "list_devices"]

LIST_ALL_UP_TO = 64
"""Listings of at most this many devices show every one."""
LIST_ENDS = 4
"""Above that, the first and the last this many are shown, besides the extremes."""


@dataclass(frozen=True)
class DeviceListing:
    """The rows of a per-device listing that a person is shown."""

    shown: tuple[int, ...]
    """Positions in the full listing that are shown, ascending."""
    extremes: tuple[tuple[int, str], ...]
    """(position, what it is the extreme of: 'slowest', 'most memory', ...), in the order asked."""
    total: int
    """Rows in the full listing."""

    @property
    def left_out(self) -> int:
        """Rows not shown."""
        return self.total - len(self.shown)

    def label(self, position: int) -> str:
        """What the row at `position` is the extreme of ('slowest, most memory'), or '' when none;
        only when rows are left out (with every row shown, no row needs saying why it is there)."""
        if not self.left_out:
            return ""
        return ", ".join(what for pos, what in self.extremes if pos == position)

    def gap_before(self, position: int) -> int:
        """Rows left out between the shown row at `position` and the shown one before it."""
        index = self.shown.index(position)
        return position - self.shown[index - 1] - 1 if index > 0 else 0

    def left_out_line(self, where: str) -> str | None:
        """None when every row is shown; else one line: how many devices were left out, which ones
        are shown, and `where` every device's numbers are."""
        if not self.left_out:
            return None
        kinds = [f"the one with the {what}" if what.startswith("most ") else f"the {what}"
                 for what in dict.fromkeys(what for _, what in self.extremes)]
        items = [f"the first {LIST_ENDS}", f"the last {LIST_ENDS}", *kinds]
        shown = ", ".join(items[:-1]) + " and " + items[-1]
        return f"{self.left_out:,} of {self.total:,} devices not listed (shown: {shown}); every device: {where}"


def list_devices(total: int, extremes: Sequence[tuple[str, Sequence[float | None]]] = ()) -> DeviceListing:
    """The listing of `total` devices: every one up to LIST_ALL_UP_TO; else the first and last
    LIST_ENDS and, for each (what, values) of `extremes` ('slowest', busy times), the device with the
    largest value (the first of equals; None values skipped)."""
    found = []
    for what, values in extremes:
        known = [(value, -i) for i, value in enumerate(values) if value is not None]
        if known:
            found.append((-max(known)[1], what))
    if total <= LIST_ALL_UP_TO:
        return DeviceListing(shown=tuple(range(total)), extremes=tuple(found), total=total)
    ends = set(range(LIST_ENDS)) | set(range(total - LIST_ENDS, total))
    return DeviceListing(shown=tuple(sorted(ends | {pos for pos, _ in found})), extremes=tuple(found), total=total)
