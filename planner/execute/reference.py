"""The single-process run a pipelined run must equal: same model, data, seed and optimizer,
with gradient accumulation over the same micro-batches (pipelining is synchronous training).

Each step splits make_batch(global batch, step_seed(seed, step)) into the plan's micro-batches
exactly as torch's schedules do (`tensor_split` along dim 0), backpropagates loss / M for each
and takes one optimizer step. torch's schedules instead backpropagate the unscaled loss and
divide the accumulated gradients by M, so the two agree to float rounding, not bit for bit
(exactly when M is a power of two).

Data parallelism (plan.parallel.dp = D > 1): the global batch is cut into D replica slices
(planner.execute.pipeline.replica_slice); each slice's gradients are accumulated over its M
micro-batches on their own, then summed over replicas in replica order and divided by D, the
sum a D-replica run's all-reduce forms (for D = 2 the same additions, so the same bits); the
step's loss is the mean of the replicas' mean losses.
"""

from __future__ import annotations

from typing import Any

import torch

from planner.execute.pipeline import replica_slice
from planner.execute.stages import make_optimizer, step_seed
from planner.plan import Plan

__all__ = ["reference_run"]


def _split(obj: Any, n: int) -> list[Any]:
    if isinstance(obj, torch.Tensor):
        return list(torch.tensor_split(obj, n, dim=0))
    if isinstance(obj, (tuple, list)):
        parts = [_split(o, n) for o in obj]
        return [type(obj)(p[i] for p in parts) for i in range(n)]
    return [obj] * n


def reference_run(plan: Plan, steps: int, lr: float = 1e-3, start_state: dict[int, dict] | None = None,
                  first_step: int = 0, model_kwargs: dict[str, Any] | None = None) -> tuple[list[float], dict[int, dict]]:
    """(loss per step, layer index -> state dict after the last step) of the plan's model.

    Recompute is not applied: checkpointing changes memory, not the mathematics.
    """
    from planner.models import build_model

    bundle = build_model(plan.model, seed=plan.seed, **(model_kwargs or {}))
    layers = list(bundle.layers.children())
    if start_state:
        for i, layer in enumerate(layers):
            layer.load_state_dict(start_state[i])
    model = bundle.layers
    opt = make_optimizer(plan.optimizer, list(model.parameters()), lr)
    M = plan.n_microbatches
    dp = plan.dp
    params = list(model.parameters())
    losses = []
    for step in range(first_step, first_step + steps):
        x, y = bundle.make_batch(plan.global_batch, step_seed(plan.seed, step))
        summed: list[Any] = [None] * len(params)
        replica_losses = []
        for d in range(dp):
            xd, yd = replica_slice(x, d, dp), replica_slice(y, d, dp)
            total = 0.0
            for xm, ym in zip(_split(xd, M), _split(yd, M)):
                loss = bundle.loss_fn(model(xm), ym)
                (loss / M).backward()
                total += float(loss.detach())
            replica_losses.append(total / M)
            if dp > 1:
                for i, p in enumerate(params):
                    if p.grad is not None:
                        summed[i] = p.grad if summed[i] is None else summed[i] + p.grad
                    p.grad = None
        if dp > 1:
            for p, g in zip(params, summed):
                p.grad = None if g is None else g / dp
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(sum(replica_losses) / dp)
    return losses, {i: {k: v.detach().clone() for k, v in layer.state_dict().items()} for i, layer in enumerate(layers)}
