"""What a split backward's W holds while it runs, beyond its stage's gradients.

torch's zero-bubble W (stage_backward_weight) makes the weight gradients parameter group by
parameter group, in the parameters' order (a Linear's weight and bias are one group). Where the
gradients exist already (every W after the step's first), it adds each group's fresh gradients into
them and keeps that group's tuple referenced while it makes the next group's: during group k the
stage holds, beyond its gradients, group k-1's fresh gradients, group k's and the ops' temporaries.
The profile measures per layer, alone (planner.profiling.split_backward):

  w_workspace_bytes  the allocator's peak above the start of that layer's W (its own group pairs
                     and temporaries)
  w_carry_bytes      its last group's gradient bytes, still held while the next layer's first
                     group runs

so a stage [first, end)'s W holds max over its layers l of w_workspace[l] + the carry of the
stage's nearest layer before l with parameters (none for its first). Only a W after the stage's
first of the step holds it: the first finds no .grad and assigns its fresh gradients as the
gradients (`weight.grad = dw`), which the stage's gradient bytes count from that W's start
(planner.schedules.memory_states marks the moments). Charging it at the first W too had put the
synthetic model's zero-bubble plans (4 and 8 processes, one micro-batch per rank) 6.3% and 8.4%
over the allocator's peak on their worst rank; with the first W left out, +0.1%. The first stage's W is a
whole backward (planner.cost.held: its I computes nothing), priced by the recompute transient,
so this is 0 there. Measured (torch's CPU allocator, per action, mlp of 2048-wide Linears, 2 ranks,
zb, 4 micro-batches of 32): the last rank's later Ws peaked 31.8 MiB above their start, two
16 MiB weight gradients, where the cost model charged nothing until this rule; the 4-rank synthetic
pipeline's stages of 2 MB-parameter layers 3.8 MB. A layer's first group may not be where its own
peak is: then the sum is an upper bound.

Profiles without the columns charge nothing (the plans they made stay what they were).
"""

from __future__ import annotations

from typing import Sequence

__all__ = ["stage_w_workspace"]


def stage_w_workspace(workspace: Sequence[float] | None, carry: Sequence[float] | None, first: int, end: int) -> float:
    """What a W of stage [first, end) holds while it runs beyond the stage's gradients (module
    docstring): 0 for the first stage, an empty stage and without the w_workspace_bytes column."""
    if workspace is None or first == 0 or end <= first:
        return 0.0
    best, held = 0.0, 0.0
    for l in range(first, end):
        best = max(best, float(workspace[l]) + held)
        if carry is not None and carry[l] > 0:
            held = float(carry[l])
    return best

