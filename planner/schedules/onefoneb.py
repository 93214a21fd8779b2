"""1F1B (PipeDream-Flush, Narayanan et al. 2021).

Rank r runs stage r. It first runs w = min(M, S - r) warm-up forwards, then alternates one
backward and one forward until the forwards run out, then drains the remaining backwards.
That is the order torch's `Schedule1F1B._step_microbatches` executes; at most S - r
micro-batches of activations are held on stage r.
"""

from __future__ import annotations

from planner.schedules.actions import Action, ActionKind

__all__ = ["one_f_one_b_order"]

_F, _B = ActionKind.FORWARD, ActionKind.FULL_BACKWARD  # members, not letters: Action need not convert them


def one_f_one_b_order(n_ranks: int, n_microbatches: int) -> dict[int, list[Action]]:
    """rank -> compute actions (no idle slots) of a 1F1B schedule."""
    M = n_microbatches
    order: dict[int, list[Action]] = {}
    for r in range(n_ranks):
        warmup = min(M, n_ranks - r)
        acts = [Action(r, _F, m) for m in range(warmup)]
        for i in range(M - warmup):
            acts.append(Action(r, _B, i))
            acts.append(Action(r, _F, warmup + i))
        acts.extend(Action(r, _B, m) for m in range(M - warmup, M))
        order[r] = acts
    return order
