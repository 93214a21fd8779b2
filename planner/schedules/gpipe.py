"""GPipe (Huang et al. 2019): every forward, then every backward.

Rank r runs stage r: F0 F1 ... F(M-1), then B0 B1 ... B(M-1) — the order of torch's
`ScheduleGPipe` (backwards in ascending micro-batch order). Every stage holds all M
micro-batches of activations at its peak.
"""

from __future__ import annotations

from planner.schedules.actions import Action, ActionKind

__all__ = ["gpipe_order"]

_F, _B = ActionKind.FORWARD, ActionKind.FULL_BACKWARD  # members, not letters: Action need not convert them


def gpipe_order(n_ranks: int, n_microbatches: int) -> dict[int, list[Action]]:
    """rank -> compute actions (no idle slots) of a GPipe schedule."""
    M = n_microbatches
    return {
        r: [Action(r, _F, m) for m in range(M)] + [Action(r, _B, m) for m in range(M)]
        for r in range(n_ranks)
    }
