"""ZB-H1 (Qi et al., ICLR 2024): 1F1B with the backward split into I and W.

Rank r runs stage r. Like 1F1B it warms up with min(M, P-1-r) forwards and then pairs each
forward with an input-gradient backward I (on the critical path). The weight-gradient halves W
are deferred: rank r runs its first r steady-state pairs without W, then follows every I with
the W of the oldest micro-batch still waiting, and flushes the rest at the end. The W fill the
cool-down bubble. This is the order of torch's `ScheduleInterleavedZeroBubble` built with one
stage per rank. Activations live until W, so every rank holds up to P micro-batches: the same
peak as 1F1B's first stage, which sets 1F1B's peak.
"""

from __future__ import annotations

from planner.schedules.actions import Action, ActionKind

__all__ = ["zb_h1_order"]

_F, _I, _W = ActionKind.FORWARD, ActionKind.BACKWARD_INPUT, ActionKind.BACKWARD_WEIGHT  # members, not letters: Action need not convert them


def zb_h1_order(n_ranks: int, n_microbatches: int) -> dict[int, list[Action]]:
    """rank -> compute actions (no idle slots) of a ZB-H1 schedule."""
    P, M = n_ranks, n_microbatches
    order: dict[int, list[Action]] = {}
    for r in range(P):
        warmup = min(P - 1 - r, M)
        acts = [Action(r, _F, m) for m in range(warmup)]
        f = warmup
        i = w = 0
        for k in range(warmup, M + warmup):
            if k < M:
                acts.append(Action(r, _F, f))
                f += 1
            acts.append(Action(r, _I, i))
            i += 1
            if k - warmup >= r:
                acts.append(Action(r, _W, w))
                w += 1
        acts.extend(Action(r, _W, m) for m in range(w, M))
        order[r] = acts
    return order
