"""Interleaved 1F1B (Megatron-LM, Narayanan et al. 2021), in torch's order.

Rank r runs the v stages r, r + P, ..., r + (v-1)P (P ranks). Micro-batches go in rounds:
torch 2.13 uses rounds = max(1, M // P) rounds of M / rounds micro-batches each (it requires
M to be a multiple of the round count, which `check_sizes` enforces). Forwards visit the local
stages depth first, one round at a time: step k forwards stage ((k // per_round) mod v).
Rank r starts with (v-1)·per_round + 2(P-1-r) warm-up forwards (capped at M·v), then pairs
one forward with one backward (backwards visit the local stages last-first), then drains.
With M a multiple of P this is Megatron's schedule: bubble (P-1)(f+b)/v for per-chunk times
f/v, b/v.
"""

from __future__ import annotations

from planner.schedules.actions import Action, ActionKind

__all__ = ["interleaved_order", "rounds"]

_F, _B = ActionKind.FORWARD, ActionKind.FULL_BACKWARD  # members, not letters: Action need not convert them


def rounds(n_ranks: int, n_microbatches: int) -> tuple[int, int]:
    """(number of rounds, micro-batches per round) as torch's interleaved schedules choose them."""
    n = max(1, n_microbatches // n_ranks)
    return n, n_microbatches // n


def interleaved_order(n_ranks: int, n_microbatches: int, virtual_stages: int) -> dict[int, list[Action]]:
    """rank -> compute actions (no idle slots) of an interleaved 1F1B schedule."""
    P, M, v = n_ranks, n_microbatches, virtual_stages
    _, per_round = rounds(P, M)
    total = M * v
    order: dict[int, list[Action]] = {}
    for r in range(P):
        warmup = min((v - 1) * per_round + 2 * (P - 1 - r), total)
        next_f = [0] * v
        next_b = [0] * v
        acts: list[Action] = []

        def forward(k: int) -> None:
            local = (k // per_round) % v
            acts.append(Action(local * P + r, _F, next_f[local]))
            next_f[local] += 1

        def backward(k: int) -> None:
            local = v - 1 - ((k - warmup) // per_round) % v
            acts.append(Action(local * P + r, _B, next_b[local]))
            next_b[local] += 1

        for k in range(warmup):
            forward(k)
        for k in range(warmup, total):
            forward(k)
            backward(k)
        for k in range(total, total + warmup):
            backward(k)
        order[r] = acts
    return order
