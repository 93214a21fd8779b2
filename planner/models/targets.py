"""Targets and outputs that are a tuple or dict of tensors, for `module:factory` models.

A model with two heads (class scores and a box, a main and an auxiliary classifier) returns a
tuple or dict and is trained on a target of the same structure. The profiler and torch's
pipeline schedules take one target tensor, which they split into micro-batches along its
first dimension and move to the device (casting floating ones to the profiled dtype). So a
structured target travels *packed*: every leaf flattened per sample, its bits reinterpreted as
integers and widened to int64, all leaves side by side in one (batch, n) int64 tensor that no
dtype cast touches; the loss unpacks it into the user's structure, dtypes and values exactly
(bit for bit) before calling the user's `loss_fn`.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from planner.errors import ModelSpecError

__all__ = ["pack_structured_target", "flatten_structured_output", "noise_like", "mse_over_leaves"]

# int type of each element size: its bits hold the element exactly, widened to int64 and back
_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _pack_leaf(t: torch.Tensor, batch: int) -> torch.Tensor:
    t = t.detach().contiguous().reshape(batch, -1)
    return t.view(_INT_OF_SIZE[t.element_size()]).to(torch.int64)


def _unpack_leaf(col: torch.Tensor, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    bits = col.to(_INT_OF_SIZE[torch.empty((), dtype=dtype).element_size()]).contiguous()
    return bits.view(dtype).reshape(col.shape[0], *shape)


def pack_structured_target(make_batch: Callable[[int, int], tuple[Any, Any]], loss_fn: Callable[[Any, Any], Any],
                           spec: str) -> tuple[Callable[[int, int], tuple[Any, Any]], Callable[[Any, Any], Any]]:
    """(make_batch, loss_fn) unchanged when the target is a tensor; else a pair whose target is
    the packed int64 tensor and whose loss unpacks it first (module docstring)."""
    _, example = make_batch(1, 0)
    if isinstance(example, torch.Tensor):
        return make_batch, loss_fn
    leaves, treespec = tree_flatten(example)
    bad = [type(t).__name__ if not isinstance(t, torch.Tensor) else f"a {t.dtype} tensor of shape {tuple(t.shape)}"
           for t in leaves if not isinstance(t, torch.Tensor) or t.dim() == 0 or t.is_complex()]
    if not leaves or bad:
        raise ModelSpecError(f"model {spec!r}: make_batch's target is a {type(example).__name__} holding "
                             f"{bad[0] if bad else 'nothing'}, not tensors with a batch dimension",
                             "return a target tensor, or a tuple or dict of tensors whose first dimension is the batch")
    layout = [(t.dtype, tuple(t.shape[1:])) for t in leaves]
    widths = [int(torch.Size(shape).numel()) for _, shape in layout]

    def make(batch_size: int, seed: int) -> tuple[Any, torch.Tensor]:
        x, target = make_batch(batch_size, seed)
        parts, spec_now = tree_flatten(target)
        if spec_now != treespec or any(not isinstance(t, torch.Tensor) or t.shape[0] != batch_size for t in parts):
            raise ModelSpecError(f"model {spec!r}: make_batch({batch_size}, {seed}) returns a target of another structure "
                                 "or batch size than make_batch(1, 0)", "return the same tuple or dict of tensors for every batch")
        return x, torch.cat([_pack_leaf(t, batch_size) for t in parts], dim=1)

    def loss(output: Any, packed: torch.Tensor) -> Any:
        cols = torch.split(packed, widths, dim=1)
        return loss_fn(output, tree_unflatten([_unpack_leaf(c, dt, sh) for c, (dt, sh) in zip(cols, layout)], treespec))

    return make, loss


def noise_like(out: Any, batch_size: int, g: torch.Generator) -> Any:
    """Standard normal targets shaped like each tensor of a model output, batch `batch_size`."""
    leaves, treespec = tree_flatten(out)
    return tree_unflatten([torch.randn(batch_size, *t.shape[1:], generator=g) for t in leaves], treespec)


def mse_over_leaves(output: Any, target: Any) -> torch.Tensor:
    """Sum over the output's tensors of their mean squared error against the target's."""
    outs, targets = tree_flatten(output)[0], tree_flatten(target)[0]
    return sum(torch.nn.functional.mse_loss(o.float(), t.float()) for o, t in zip(outs, targets))


def flatten_structured_output(layers: torch.nn.Sequential, loss_fn: Callable[[Any, Any], Any], out: Any) -> Callable[[Any, Any], Any]:
    """Make the last layer return a flat tuple of tensors when the model returns a dict (or a
    nested or named structure): torch's pipeline stages send and hand the loss only a tensor or
    a tuple of tensors. A forward hook flattens (the layer and its state dict keys stay the
    user's); the returned loss puts the structure back before calling `loss_fn`. `loss_fn`
    itself comes back for a tensor or a plain tuple or list of tensors. `out`: the model's output
    on an example."""
    if isinstance(out, torch.Tensor) or (type(out) in (tuple, list) and all(isinstance(t, torch.Tensor) for t in out)):
        return loss_fn
    _, treespec = tree_flatten(out)
    last = list(layers.children())[-1]
    last.register_forward_hook(lambda _m, _a, output: tuple(tree_flatten(output)[0]))

    def loss(output: Any, target: Any) -> Any:
        leaves, now = tree_flatten(output)
        # flat from the hooked layer; the structure itself from code that runs the traced
        # layers directly (the profiler's LayerGraph.layer_module)
        return loss_fn(output if now == treespec else tree_unflatten(leaves, treespec), target)

    return loss
