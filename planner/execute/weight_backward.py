"""Zero-bubble's weight backward (W) as pplan runs it on torch's pipeline stages.

torch's W step (`stage_backward_weight`) differentiates one parameter group at a time. pplan
wraps it so that it gives the gradients a full backward gives and recomputes a checkpointed
layer once, not once per group (`retain_graph_in_weight_backward`).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch.utils import checkpoint as _checkpoint

__all__ = ["retain_graph_in_weight_backward"]


def _one_recompute_per_w() -> Any:
    """torch's GraphExecGroup where it exists: every autograd.grad call of one W then shares a
    single recompute of each checkpointed layer. Without it each parameter group's call is a new
    graph task that recomputes the layer again, and with the graph retained every recompute stays
    alive until W ends (a GPT block has 6 groups: measured 38.2 MB against 21.2 MB on the
    deferring rank of a 2-rank zb plan with every layer recomputed, identical losses)."""
    group = getattr(_checkpoint, "GraphExecGroup", None)
    return group() if group is not None else contextlib.nullcontext()


def _any_needs_grad(values: Any) -> bool:
    """Whether any tensor among a stage's inputs takes part in autograd (needs or carries a gradient)."""
    return any(isinstance(v, torch.Tensor) and (v.requires_grad or v.grad_fn is not None) for v in values)


def _as_full_backward(kwargs: dict) -> dict:
    """An I step's arguments as the full backward takes them: torch's I wraps a last stage's loss in a
    tuple, which the full backward, given no output gradient, would skip as a tuple without one."""
    output = kwargs["stage_output"]
    if kwargs.get("output_grads") is None and isinstance(output, tuple) and len(output) == 1:
        return {**kwargs, "stage_output": output[0]}
    return kwargs


def retain_graph_in_weight_backward(stages: list[Any]) -> None:
    """Make split (I/W) backwards give the gradients a full backward gives.

    Graph: torch's W step differentiates one parameter group at a time and frees the graph behind
    each; from the later use of a weight used twice in one stage (tied embeddings, a module called
    twice) it reaches layers whose saved tensors another group freed ("backward through the graph
    a second time"). Kept until W ends, the gradients are the same (torch clamps each
    intermediate's gradient to the one saved at I), freed as W lets go of it.

    Layout: W stores a weight's first gradient as autograd returns it, maybe a view with other
    strides (MobileBERT's tied `cat([decoder.weight.t(), ...])` gets a transposed view into the
    cat's gradient), which gloo's all-reduce of the tied sum adds in storage order (element i to
    its transpose's element i): it is copied into the weight's own layout, as AccumulateGrad does.

    Recompute: the groups' calls share one recompute of each checkpointed layer (_one_recompute_per_w).

    A stage none of whose inputs needs a gradient (token ids, or the output of a parameter-free
    first stage): torch finds a stage's weights for W from its inputs' gradient paths, so it found
    none and the weights got no gradient at all, training on silently wrong. Such a stage has no
    input gradient to hurry to its neighbour: its I runs the full backward, and its W has nothing left."""
    from torch.distributed.pipelining._backward import stage_backward_weight

    for st in stages:
        def backward(kind: str, kwargs: dict, last_backward: bool = False, run: Any = st.backward_maybe_with_nosync,
                     st: Any = st) -> Any:
            if kind == "input" and not _any_needs_grad(kwargs["input_values"]):
                grads, _ = run("full", _as_full_backward(kwargs), last_backward)
                return grads, []  # no parameter groups: the W step that follows computes nothing
            if kind != "weight":
                return run(kind, kwargs, last_backward)
            fresh = [p for p in st.submod.parameters() if p.grad is None]
            with _one_recompute_per_w():
                out = stage_backward_weight(st.submod.parameters(), kwargs["param_groups"], retain_graph=True)
            for p in (p for p in fresh if p.grad is not None):
                p.grad = torch.empty_like(p).copy_(p.grad)
            return out, None

        st.backward_maybe_with_nosync = backward
