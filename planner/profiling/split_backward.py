"""What one layer's split backward (zero-bubble I, then W) holds: the profile's wgrad_bytes,
w_workspace_bytes and w_carry_bytes.

I is torch's `stage_backward_input`, W its `stage_backward_weight`
(torch.distributed.pipelining._backward). W computes the weight gradients parameter group by
parameter group (torch's get_param_groups, in the parameters' order: one group per op whose
weights meet the input's path, e.g. a Linear's weight and bias). Once a parameter's .grad
exists (every W after a step's first) it does `weight.grad += dw`, and the tuple of the previous
group's fresh gradients stays referenced while the next group's are computed. So while a W runs,
the stage holds beyond its gradients the previous group's fresh weight gradients, the current
group's and the ops' temporaries. Measured with torch's CPU allocator around
stage_backward_weight, gradients already there: one Linear(2048, 2048) +16.0 MiB (its one
group), Linear-ReLU-Linear of 2048 +32.0 MiB (two groups), a gpt block of hidden 256 +2.0 MiB
(its two FFN matrices, adjacent groups), gpt's LayerNorm + LM head (8192 x 256) +8.0 MiB, a
resnet stage with tiny weights +3.0 MiB (convolution weight-gradient temporaries).

Per layer, measured alone right after its I: `w_workspace_bytes` is that peak, `w_carry_bytes`
the bytes of the gradients of the layer's last group (what the next layer's first group of the
same stage computes beside). The cost model prices a stage's W as the largest over its layers of
w_workspace plus the carry of the stage's previous layer with parameters. All three are 0 for a
layer without parameters, or whose inputs need no gradient: torch runs such a (first) stage's
whole backward at W and holds nothing between.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from planner.profiling.layerpeak import allocator_peak_of
from planner.profiling.saved import storage_key

__all__ = ["SplitBackwardBytes", "split_backward_bytes"]


@dataclass(frozen=True)
class SplitBackwardBytes:
    """What one layer's split backward holds, per micro-batch (module docstring)."""

    wgrad_bytes: int = 0
    """Gradients I keeps for W (where a weight's path meets the input's), once per storage."""
    w_workspace_bytes: int = 0
    """The allocator's peak above its start during the layer's W, parameter gradients already there."""
    w_carry_bytes: int = 0
    """Bytes of the weight gradients of the layer's last parameter group, alive into the next one's."""


def split_backward_bytes(roots: list[torch.Tensor], grads: list[torch.Tensor] | None, inputs: list[torch.Tensor],
                         params: list[torch.nn.Parameter], device: torch.device) -> SplitBackwardBytes:
    """Run I once on `roots` (a fresh graph: torch detaches them in place, so each is cloned out
    of any view) seeded with `grads` (None: a loss, seeded with ones), then W on the groups I made.

    wgrad_bytes: a gradient that is the seed's own storage counts too: inside a stage the seed is
    the next layer's input gradient, made for this micro-batch and held with it (on a stage's last
    layer it is the received gradient, whose buffer the runtime keeps anyway: an upper bound).
    The .grad of `inputs` and of the parameters that had none are None again afterwards; a
    parameter that had one keeps it with this W accumulated in, as every micro-batch does."""
    wanted = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    if not params or not wanted:
        return SplitBackwardBytes()
    from torch.distributed.pipelining._backward import (
        _get_grad_fn_or_grad_acc, stage_backward_input, stage_backward_weight)

    _, groups = stage_backward_input([r.clone() for r in roots], grads, wanted, iter(params))
    # a group whose nodes I never reached has nothing for W to start from (torch's W would fail on it)
    groups = [g for g in groups if g.get("grads") is not None]
    for t in wanted:  # the input gradient I computed is sent on, not held for W
        t.grad = None
    kept = [g for group in groups for grad_inputs in group["grads"] for g in grad_inputs or () if isinstance(g, torch.Tensor)]
    held: dict[tuple, int] = {}  # storage -> bytes, each storage once
    for g in kept:
        key, nbytes = storage_key(g)
        held[key] = max(nbytes, held.get(key, 0))
    # W's last dweights is that of the last group with a gradient to start from (torch skips the others)
    by_node = {_get_grad_fn_or_grad_acc(p): p for p in params}
    last = next((g for g in reversed(groups) if any(x is not None for t in g["grads"] for x in t or ())), None)
    carry = sum(by_node[n].numel() * by_node[n].element_size() for n in last["params"]) if last else 0
    fresh = [p for p in params if p.grad is None]
    for p in fresh:  # every W after the step's first accumulates into existing gradients
        p.grad = torch.zeros_like(p)
    try:
        # What I made stays referenced through W (`kept`) and the graph too (retain_graph): W frees
        # them as it goes, but they were allocated before it; CPU and CUDA alike count only what W
        # allocates (torch's CPU allocator does not count frees of older blocks, and warns of them).
        workspace = allocator_peak_of(lambda: stage_backward_weight(iter(params), groups, retain_graph=True), device)
    finally:
        for p in fresh:
            p.grad = None
        kept.clear()
    return SplitBackwardBytes(sum(held.values()), workspace, carry)
