"""The schedule IR: per-rank ordered lists of actions, as torch.distributed.pipelining writes them.

An action is (stage, kind, micro-batch), printed `1F0`, `0B3`, `2I1`, `2W1`. Kinds are the
enum ActionKind (torch's `_ComputationType` letters): F forward, B full backward, I
input-gradient half and W weight-gradient half of a split backward (zero-bubble schedules).
An ActionKind is a `str`, so `Action(0, "F", 0)` and `a.kind == "F"` keep working. `None` in a rank's list is an idle slot, kept only so a
schedule can be compared step for step with torch's `pipeline_order`; the simulator and
executor skip it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from planner.errors import ScheduleError

__all__ = ["ActionKind", "KINDS", "N_KINDS", "Action", "PipelineSchedule", "parse_action", "format_order"]


class ActionKind(str, Enum):
    """What an action computes; the value is the letter torch writes (`0F3`)."""

    FORWARD = "F"
    FULL_BACKWARD = "B"
    BACKWARD_INPUT = "I"
    BACKWARD_WEIGHT = "W"

    # A str subclass that hashes and prints as its letter: equal to "F" and found under "F" in
    # dicts and sets (Enum would hash the member name), and f"{kind}" writes "F".
    __hash__ = str.__hash__

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @property
    def code(self) -> int:
        """0..3 in declaration order: the integer the compiled schedule indexes tables by."""
        return _CODE[self]


_CODE = {k: i for i, k in enumerate(ActionKind)}
KINDS = tuple(k.value for k in ActionKind)  # letters by code: KINDS[kind.code] == kind
N_KINDS = len(KINDS)
_ACTION_RE = re.compile(r"^\s*([0-9]+)\s*([FBIW])\s*([0-9]+)\s*$")  # ASCII digits: \d also reads other scripts' digits


@dataclass(frozen=True, order=True)
class Action:
    """One unit of pipeline work on one stage for one micro-batch."""

    stage: int
    """Global stage index (0 = first layers of the model)."""
    kind: ActionKind
    """F, B, I or W (a plain letter is converted; ScheduleError for anything else)."""
    microbatch: int
    """Micro-batch index, 0-based."""

    def __post_init__(self) -> None:
        if type(self.kind) is not ActionKind:  # generators pass members; skip the lookup for them
            try:
                kind = ActionKind(self.kind)
            except ValueError:
                raise ScheduleError(f"action kind {self.kind!r} is not one of {', '.join(KINDS)}") from None
            object.__setattr__(self, "kind", kind)

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.microbatch}"


def parse_action(text: str) -> Action:
    """`'1F0'` -> Action(1, 'F', 0)."""
    m = _ACTION_RE.match(text)
    if not m:
        raise ScheduleError(f"cannot read action {text!r}", "write actions like 0F3 (stage, kind F/B/I/W, micro-batch)")
    return Action(int(m.group(1)), m.group(2), int(m.group(3)))


@dataclass(frozen=True)
class PipelineSchedule:
    """A whole schedule: which rank runs which stages, and each rank's order of actions."""

    name: str
    """Schedule family: gpipe, 1f1b, interleaved, zb (ZB-H1), or custom."""
    n_ranks: int
    """Devices in the pipeline."""
    n_stages: int
    """Stages (= n_ranks * virtual stages per rank)."""
    n_microbatches: int
    """Micro-batches per iteration."""
    stage_rank: tuple[int, ...]
    """stage index -> rank that runs it."""
    order: dict[int, tuple[Action | None, ...]]
    """rank -> ordered actions (None = idle slot)."""

    @property
    def split_backward(self) -> bool:
        """True when backward is split into I and W (zero-bubble family)."""
        split = (ActionKind.BACKWARD_INPUT, ActionKind.BACKWARD_WEIGHT)
        return any(a is not None and a.kind in split for acts in self.order.values() for a in acts)

    def actions(self, rank: int) -> list[Action]:
        """The rank's actions without idle slots."""
        return [a for a in self.order[rank] if a is not None]

    def to_csv_rows(self) -> list[list[str]]:
        """One row per rank, torch's CSV layout (empty cell = idle)."""
        return [["" if a is None else str(a) for a in self.order[r]] for r in range(self.n_ranks)]


def format_order(order: dict[int, list[Action | None]] | dict[int, tuple[Action | None, ...]],
                 mark: tuple[int, int] | None = None) -> str:
    """Rank x step grid as text; `mark=(rank, step)` brackets one cell (used for deadlocks)."""
    steps = max((len(v) for v in order.values()), default=0)
    # +3: room for the [ ] that marks a cell, and a space between columns
    width = max([4] + [len(str(a)) + 3 for v in order.values() for a in v if a is not None])
    lines = ["step".ljust(8) + "".join(str(i).rjust(width) for i in range(steps))]
    for rank in sorted(order):
        cells = []
        for i in range(steps):
            a = order[rank][i] if i < len(order[rank]) else None
            text = "." if a is None else str(a)
            if mark == (rank, i):
                text = f"[{text}]"
            cells.append(text.rjust(width))
        lines.append(f"rank {rank}".ljust(8) + "".join(cells))
    return "\n".join(lines)
