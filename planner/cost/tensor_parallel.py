"""One GPU's share of a profile's per-layer costs under T-way tensor parallelism, as `pplan run`
executes it (planner/execute/tensor.py), with ZeRO's per-layer terms over D. Pure.

Megatron's split (Shoeybi et al. 2019; Narayanan et al. SC21 section 2.3): a transformer block's
matmuls, attention, weights and optimizer step divide by T; the embedding, final norm and head stay whole on
every tp rank (Megatron's vocabulary split, `vocab_parallel`, divides them too: for comparing with
its published runs). Each block adds two all-reduces of its b*s*h output in the forward and two in
the backward (and a recomputed forward's), on the intra-node link. A block's norms and
row-parallel biases (6h parameters) stay whole too; the model divides them: 1/(2h) of the block.

Compute left whole (`tp_whole_ms`): the memory-bound kernels on the block's whole b*s*h tensors run
on every tp rank, and no T divides them: the two layer norms and the two residual adds, forward and
backward, and the row-parallel biases' gradients. A profile measures the block as one time, so
that part is priced from bytes: TP_WHOLE_PASSES x the block's output bytes at the hardware's memory
bandwidth (x MEMORY_BOUND_FRACTION, as the analytic profile's roofline prices the same kernels), at
most the block's time; only the rest divides by T. Dividing all of it made tp look cheaper the
smaller the model: by the analytic roofline of a tp-split block, hidden 12288 at T = 8 was priced
6% fast, hidden 2048 54%.

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

import math
from dataclasses import replace

import numpy as np

from planner.cost.collectives import Link2, allreduce_ms
from planner.cost.data_parallel import zero3_gather_ms, zero3_gathered_bytes, zero_weight_gather_ms
from planner.profiling.profile import LayerCosts

__all__ = ["TP_WHOLE_OUTPUTS", "TP_WHOLE_WGRAD_OUTPUTS", "TP_WHOLE_PASSES", "tp_layers", "tp_shards",
           "tp_kept_activation_bytes", "tp_wgrad_bytes", "tp_whole_ms", "collective_ms", "tensor_parallel_costs"]

TP_WHOLE_OUTPUTS = 4.0
"""Tensors of a block's output size that a tensor-parallel block keeps whole on every tp rank:
the inputs of its two layer norms and of its two column-parallel linears (module docstring)."""

TP_WHOLE_WGRAD_OUTPUTS = 4.0
"""Gradients of a block's output size that its I keeps for W whole on every tp rank: those at the
outputs of its two layer norms and of its two row-parallel linears (module docstring)."""


TP_WHOLE_PASSES = (10.0, 12.0, 2.0)
"""Tensors of a block's output size that its kernels left whole on every tp rank read and write, per
forward, input-gradient and weight-gradient backward: forward, each norm reads its input and writes
its output (2 x 2) and each residual add reads two and writes one (2 x 3); input gradient, each norm
reads x and dy and writes dx (2 x 3) and each residual branch point sums two gradients (2 x 3); weight
gradient, each row-parallel bias reads the whole output gradient (2 x 1). The analytic block's kernels."""


def tp_whole_ms(output_bytes: np.ndarray, blocks: np.ndarray, shards: np.ndarray,
                memory_bytes_per_s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per layer, (forward, input-gradient, weight-gradient) ms of the kernels a sharded block runs
    whole on every tp rank (TP_WHOLE_PASSES x its output bytes at `memory_bytes_per_s`, what
    memory-bound kernels reach); zero for a layer that is no sharded block, and with no bandwidth
    given (inf)."""
    sharded = np.asarray(blocks, dtype=bool) & (np.asarray(shards, dtype=float) > 1)
    per_pass = np.where(sharded, 1e3 * np.asarray(output_bytes, dtype=float) / memory_bytes_per_s, 0.0)
    fwd, bwd_in, bwd_w = TP_WHOLE_PASSES
    return fwd * per_pass, bwd_in * per_pass, bwd_w * per_pass


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
                          compute_scale: float = 1.0, vocab_parallel: bool = False,
                          memory_bytes_per_s: float = math.inf) -> LayerCosts:
    """One GPU's share of `costs` under T-way tensor parallelism (and ZeRO's per-layer terms over D).

    Compute (forward, both backward halves, optimizer step) and parameter bytes of every block
    divide by T but for the kernels it runs whole (tp_whole_ms at `memory_bytes_per_s`, the
    hardware's memory-bound bandwidth; inf: none), the rest stays whole (as `pplan run` executes them; every layer divides under
    Megatron's `vocab_parallel`: tp_shards), and so do the optimizer step's temporaries (each rank
    steps its own shards); kept activations are tp_kept_activation_bytes and
    what W keeps (wgrad) tp_wgrad_bytes, what it makes (w_workspace, w_carry: weight gradients) / T; `collective_ms` is added to the forward and to the input-gradient
    backward; under ZeRO-3 each layer's workspace grows by its gathered weights
    (zero3_gathered_bytes). Output bytes (what a pipeline boundary sends) stay whole, as Megatron
    (2021) sends them. ZeRO 1+ divides the optimizer step by D, and ZeRO 1/2 add the weights
    gathered back after it (zero_weight_gather_ms; `dp_link` is then required).
    `compute_scale` multiplies every compute time (not communication).
    """
    if dp > 1 and zero >= 1 and dp_link is None:
        raise ValueError(f"ZeRO {zero} over {dp} replicas needs the data-parallel link (dp_link)")
    shards = tp_shards(blocks, tp, vocab_parallel)
    scale = float(compute_scale)
    comm = collective_ms(costs, blocks, tp, tp_link, dp, zero, dp_link, vocab_parallel)

    def share(ms: np.ndarray, whole: np.ndarray) -> np.ndarray:  # the whole part (at most all of it) and the rest / T
        ms = np.asarray(ms, dtype=float)
        whole = np.minimum(ms, whole)
        return scale * (whole + (ms - whole) / shards)

    whole_f, whole_i, whole_w = tp_whole_ms(costs.output_bytes, blocks, shards, memory_bytes_per_s)
    fwd = share(costs.fwd_ms, whole_f) + comm
    bwd_in = share(costs.bwd_input_ms, whole_i) + comm
    bwd_w = share(costs.bwd_weight_ms, whole_w)
    # bytes divide by the shards only: compute_scale is about time (it once scaled these too)
    params = np.asarray(costs.param_bytes, dtype=float) / shards
    opt = scale * np.asarray(costs.optimizer_ms, dtype=float) / shards / (dp if zero >= 1 else 1)
    if dp_link is not None:
        opt = opt + zero_weight_gather_ms(params, dp, zero, dp_link)
    act = tp_kept_activation_bytes(costs.activation_bytes, costs.output_bytes, blocks, shards)
    wgrad = None if costs.wgrad_bytes is None else tp_wgrad_bytes(costs.wgrad_bytes, costs.output_bytes, blocks, shards)
    workspace = costs.workspace_bytes
    if zero >= 3 and dp > 1:  # the computing layer's gathered weights sit on top of the shards
        base = np.zeros(len(params)) if workspace is None else np.asarray(workspace, dtype=float)
        workspace = base + zero3_gathered_bytes(params, dp, zero)
    step, w_work, w_carry = (None if c is None else np.asarray(c, dtype=float) / shards  # weight-shaped: sharded
                             for c in (costs.optimizer_workspace_bytes, costs.w_workspace_bytes, costs.w_carry_bytes))
    return replace(costs, fwd_ms=fwd, bwd_ms=bwd_in + bwd_w, bwd_input_ms=bwd_in, bwd_weight_ms=bwd_w,
                   optimizer_ms=opt, param_bytes=params, activation_bytes=act, workspace_bytes=workspace,
                   wgrad_bytes=wgrad, optimizer_workspace_bytes=step, w_workspace_bytes=w_work, w_carry_bytes=w_carry)
