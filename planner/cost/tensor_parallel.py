"""One GPU's share of a profile's per-layer costs under T-way tensor parallelism, as `pplan run`
executes it (planner/execute/tensor.py), with ZeRO's per-layer terms over D. Pure.

Megatron's split (Shoeybi et al. 2019; Narayanan et al. SC21 section 2.3): a transformer block's
compute, weights and optimizer step divide by T; the embedding, final norm and head stay whole on
every tp rank (Megatron's vocabulary split, `vocab_parallel`, divides them too: for comparing with
its published runs). Each block adds two all-reduces of its b*s*h output in the forward and two in
the backward (and a recomputed forward's), on the intra-node link. A block's norms and
row-parallel biases (6h parameters) stay whole too; the model divides them: 1/(2h) of the block.

Kept activations (`tp_kept_activation_bytes`): without sequence parallelism (Korthikanti et al.
2022), which neither `pplan run` nor Megatron (2021) runs, a pre-LN block keeps four b*s*h tensors
whole on every tp rank: the inputs of its two layer norms and of its two column-parallel linears
(QKV, FC1), the norms' outputs. A block's output is b*s*h elements, so the whole part is
TP_WHOLE_OUTPUTS = 4 times the block's output bytes; the rest (q, k, v, the attention output, the
MLP's inner activations) divides by T. GPT-3 175B at T = 8 (bf16): 8 sbh + 24 sbh / 8 bytes per
block and micro-batch, not 32 sbh / 8.

What zero-bubble's I keeps for W (`tp_wgrad_bytes`, the profile's wgrad_bytes: the gradients at the
nodes where a weight's path meets the input's) splits the same way with other tensors: the output
gradients of ln1, of the row-parallel projection and FC2 (their all-reduced outputs are replicated)
and of ln2 are b*s*h each and whole on every tp rank, TP_WHOLE_WGRAD_OUTPUTS = 4 x the block's output
bytes; those of QKV (3 b*s*h) and FC1 (ffn b*s*h) divide by T. Measured on `pplan run`'s tp block
(gloo, hidden 64, ffn 4, float32): 11, 7.5 and 5.75 x the output bytes per rank at T = 1, 2 and 4,
as 4 + 7/T (dividing all of it by T would say 5.5 and 2.75). GPT-3 175B, T = 8: 4.875 x, not 1.375 x.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from planner.cost.collectives import Link2, allreduce_ms
from planner.cost.data_parallel import zero3_gather_ms, zero3_gathered_bytes, zero_weight_gather_ms
from planner.profiling.profile import LayerCosts

__all__ = ["TP_WHOLE_OUTPUTS", "TP_WHOLE_WGRAD_OUTPUTS", "tp_layers", "tp_shards", "tp_kept_activation_bytes",
           "tp_wgrad_bytes", "collective_ms", "tensor_parallel_costs"]

TP_WHOLE_OUTPUTS = 4.0
"""Tensors of a block's output size that a tensor-parallel block keeps whole on every tp rank:
the inputs of its two layer norms and of its two column-parallel linears (module docstring)."""

TP_WHOLE_WGRAD_OUTPUTS = 4.0
"""Gradients of a block's output size that its I keeps for W whole on every tp rank: those at the
outputs of its two layer norms and of its two row-parallel linears (module docstring)."""


def tp_layers(names: tuple[str, ...]) -> np.ndarray:
    """Mask of layers that are transformer blocks (names `block*`); every layer when none is."""
    mask = np.array([n.startswith("block") for n in names], dtype=bool)
    return mask if mask.any() else np.ones(len(names), dtype=bool)


def tp_shards(blocks: np.ndarray, tp: int, vocab_parallel: bool = False) -> np.ndarray:
    """Per layer, what T-way tensor parallelism divides its compute and bytes by on one GPU: T for
    `blocks`, 1 for the rest (whole on every tp rank); T for every layer when `vocab_parallel`."""
    mask = np.ones(len(blocks), dtype=bool) if vocab_parallel else np.asarray(blocks, dtype=bool)
    return np.where(mask, float(tp), 1.0)


def tp_kept_activation_bytes(activation_bytes: np.ndarray, output_bytes: np.ndarray, blocks: np.ndarray,
                             shards: np.ndarray) -> np.ndarray:
    """Per layer, the activation bytes one tp rank keeps for backward: a sharded block keeps
    TP_WHOLE_OUTPUTS x its output bytes whole (at most all it keeps) and the rest / T; another
    sharded layer (Megatron's vocabulary-parallel embedding and head) keeps / T; an unsharded
    layer all of it. The one formula every consumer of the tensor-parallel costs uses."""
    act = np.asarray(activation_bytes, dtype=float)
    shards = np.asarray(shards, dtype=float)
    whole = np.where(np.asarray(blocks, dtype=bool) & (shards > 1),
                     np.minimum(act, TP_WHOLE_OUTPUTS * np.asarray(output_bytes, dtype=float)), 0.0)
    return whole + (act - whole) / shards


def tp_wgrad_bytes(wgrad_bytes: np.ndarray, output_bytes: np.ndarray, blocks: np.ndarray,
                   shards: np.ndarray) -> np.ndarray:
    """Per layer, what one tp rank's I keeps per micro-batch for its W: a sharded block keeps
    TP_WHOLE_WGRAD_OUTPUTS x its output bytes whole (at most all of it) and the rest / T; another
    sharded layer / T; an unsharded layer all of it (module docstring)."""
    wgrad = np.asarray(wgrad_bytes, dtype=float)
    shards = np.asarray(shards, dtype=float)
    whole = np.where(np.asarray(blocks, dtype=bool) & (shards > 1),
                     np.minimum(wgrad, TP_WHOLE_WGRAD_OUTPUTS * np.asarray(output_bytes, dtype=float)), 0.0)
    return whole + (wgrad - whole) / shards


def collective_ms(costs: LayerCosts, blocks: np.ndarray, tp: int, tp_link: Link2, dp: int = 1, zero: int = 0,
                  dp_link: Link2 | None = None, vocab_parallel: bool = False) -> np.ndarray:
    """Per layer, the collectives of one forward on one GPU, ms: a block's 2 tensor-parallel
    all-reduces of its output, plus ZeRO-3's all-gather of the layer's weights on this GPU. The
    input-gradient backward runs the same collectives again (Megatron's conjugate operators)."""
    out = np.asarray(costs.output_bytes, dtype=float)
    comm = np.where(blocks, 2.0 * allreduce_ms(out, tp, tp_link), 0.0) if tp > 1 else np.zeros(len(out))
    if zero >= 3 and dp > 1 and dp_link is not None:
        own = np.asarray(costs.param_bytes, dtype=float) / tp_shards(blocks, tp, vocab_parallel)
        comm = comm + zero3_gather_ms(own, dp, dp_link)
    return comm


def tensor_parallel_costs(costs: LayerCosts, blocks: np.ndarray, tp: int, tp_link: Link2,
                          dp: int = 1, zero: int = 0, dp_link: Link2 | None = None,
                          compute_scale: float = 1.0, vocab_parallel: bool = False) -> LayerCosts:
    """One GPU's share of `costs` under T-way tensor parallelism (and ZeRO's per-layer terms over D).

    Compute (forward, both backward halves, optimizer step) and parameter bytes of every block
    divide by T, the rest stays whole (as `pplan run` executes them; every layer divides under
    Megatron's `vocab_parallel`: tp_shards), and so do the optimizer step's temporaries (each rank
    steps its own shards); kept activations are tp_kept_activation_bytes and
    what W keeps (wgrad) tp_wgrad_bytes; `collective_ms` is added to the forward and to the input-gradient
    backward; under ZeRO-3 each layer's workspace grows by its gathered weights
    (zero3_gathered_bytes). Output bytes (what a pipeline boundary sends) stay whole, as Megatron
    (2021) sends them. ZeRO 1+ divides the optimizer step by D, and ZeRO 1/2 add the weights
    gathered back after it (zero_weight_gather_ms; `dp_link` is then required).
    `compute_scale` multiplies every compute time (not communication).
    """
    if dp > 1 and zero >= 1 and dp_link is None:
        raise ValueError(f"ZeRO {zero} over {dp} replicas needs the data-parallel link (dp_link)")
    shards = tp_shards(blocks, tp, vocab_parallel)
    t = shards / float(compute_scale)
    comm = collective_ms(costs, blocks, tp, tp_link, dp, zero, dp_link, vocab_parallel)
    fwd = np.asarray(costs.fwd_ms, dtype=float) / t + comm
    bwd_in = np.asarray(costs.bwd_input_ms, dtype=float) / t + comm
    bwd_w = np.asarray(costs.bwd_weight_ms, dtype=float) / t
    # bytes divide by the shards only: compute_scale is about time (it once scaled these too)
    params = np.asarray(costs.param_bytes, dtype=float) / shards
    opt = np.asarray(costs.optimizer_ms, dtype=float) / t / (dp if zero >= 1 else 1)
    if dp_link is not None:
        opt = opt + zero_weight_gather_ms(params, dp, zero, dp_link)
    act = tp_kept_activation_bytes(costs.activation_bytes, costs.output_bytes, blocks, shards)
    wgrad = None if costs.wgrad_bytes is None else tp_wgrad_bytes(costs.wgrad_bytes, costs.output_bytes, blocks, shards)
    workspace = costs.workspace_bytes
    if zero >= 3 and dp > 1:  # the computing layer's gathered weights sit on top of the shards
        base = np.zeros(len(params)) if workspace is None else np.asarray(workspace, dtype=float)
        workspace = base + zero3_gathered_bytes(params, dp, zero)
    step = costs.optimizer_workspace_bytes
    step = None if step is None else np.asarray(step, dtype=float) / shards
    return replace(costs, fwd_ms=fwd, bwd_ms=bwd_in + bwd_w, bwd_input_ms=bwd_in, bwd_weight_ms=bwd_w,
                   optimizer_ms=opt, param_bytes=params, activation_bytes=act, workspace_bytes=workspace,
                   wgrad_bytes=wgrad, optimizer_workspace_bytes=step)
