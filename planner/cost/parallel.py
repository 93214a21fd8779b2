"""Data- and tensor-parallel cost terms: collectives, ZeRO memory, placement, model FLOPs. Pure.

N GPUs = D x P x T. These functions turn one pipeline's per-layer costs (planner.cost) into the
costs of one GPU of a (D, P, T) layout, so the exact pipeline DP and the simulator price a
3-D plan with the same formulas as a plain pipeline (planner.partition.parallel_search).

Collectives (ring algorithms, Patarasuk & Yuan 2009; what NCCL runs for large messages), on r
ranks, n bytes, link bandwidth bw (bytes/s per direction) and per-step latency a:
    all-reduce      2(r-1) a + 2(r-1)/r * n / bw
    all-gather      (r-1) a + (r-1)/r * n / bw      (n = the gathered size)
    reduce-scatter  (r-1) a + (r-1)/r * n / bw      (n = the size before scattering)

Tensor parallelism as `pplan run` executes it (Megatron, Shoeybi et al. 2019; Narayanan et al.
SC21 section 2.3): a block's compute, weights, optimizer step and (with sequence parallelism,
Korthikanti et al. 2022) kept activations divide by T; the embedding, final norm and head stay
whole on every tp rank (Megatron's vocabulary split, `vocab_parallel`, divides them too: for
comparing with its published runs). Each block adds two all-reduces of its b*s*h output in the
forward and two in the backward (and a recomputed forward's), on the intra-node link. A block's
norms and row-parallel biases (6h parameters) stay whole too; the model divides them: 1/(2h).

Data parallelism: one gradient synchronisation per iteration over the D replicas of a stage,
an all-reduce of the stage's gradient bytes (ZeRO 1/2: reduce-scatter of gradients then
all-gather of the updated weights, the same bytes; ZeRO 3: the reduce-scatter only). It runs
after the stage's last backward; bucketed, it overlaps the backward of that last micro-batch
and nothing else (`exposed_sync_ms`), a conservative assumption: Megatron-LM (2021) did not
overlap at all, DeepSpeed and torch DDP overlap within the last backward.

Precision (`training_precision`, from the profile's `# dtype`): a 16-bit profile trains in
mixed precision with Adam, 2 weights + 2 gradients + 12 fp32 master weights, momentum and
variance = 16 bytes per parameter; a float32 profile trains in pure fp32 Adam, 4 + 4 + 8 (no
master copy), also 16. A profile's param_bytes divide by its element size to give parameters.

ZeRO (Rajbhandari et al. 2020) as `pplan run` executes it under a pipeline (`zero_shares`):
stage 1 divides the optimizer state by D; stage 2 too, and FSDP holds the whole stage's
gathered weights beside their shards from the first forward to the reduce-scatter; stage 3
divides the weights too and gathers each layer's weights before its forward and again before
its backward (all-gather, per micro-batch, not overlapped: conservative), the computing
layer's gathered weights alive on top (`zero3_gathered_bytes`). Gradients stay whole at the
peak under every stage (a pipeline accumulates them over its micro-batches).

Placement (Narayanan et al. SC21, section 3.3): T innermost within a node, then pipeline
neighbours, then D outermost; a group uses the intra-node link when it fits in one node,
else the inter-node link (bandwidth per GPU).

Model FLOPs per iteration (Narayanan et al. SC21, eq. 3, for any MLP width f h), GPT with B
samples of s tokens, l blocks of width h, vocabulary V; a block's forward matmuls per token are
2(4 + 2f) h^2 + 4 s h, the head's 2 h V: B s [l (6(4 + 2f) h^2 + 12 s h) + 6 h V], and with full
recompute B s [l (8(4 + 2f) h^2 + 16 s h) + 6 h V]; at f = 4 the paper's 72 B s l h^2 (1 + s/(6h)
+ V/(12 l h)) and 96 B s l h^2 (1 + s/(6h) + V/(16 l h)).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence

import numpy as np

from planner.cost.memory import MemoryBreakdown
from planner.errors import ModelSpecError, PplanError
from planner.models.spec import parse_spec
from planner.profiling.profile import LayerCosts, Profile

__all__ = [
    "TrainingPrecision", "MIXED_BF16", "PURE_FP32", "DEFAULT_DTYPE", "training_precision", "profile_dtype",
    "profile_precision",
    "Link2", "Placement", "placement",
    "allreduce_ms", "allgather_ms", "reduce_scatter_ms",
    "zero_bytes_per_param", "zero_shares", "zero3_gathered_bytes", "grad_sync_ms", "exposed_sync_ms", "rank_exposed_sync_ms", "zero3_gather_ms",
    "collective_ms", "tensor_parallel_costs", "tp_layers", "tp_shards", "replica_memory",
    "gpt_model_flops", "ModelFlops", "model_flops", "checked_mfu",
]


@dataclass(frozen=True)
class TrainingPrecision:
    """How a profile's model trains: bytes per parameter of each part of its static state."""

    dtype: str
    """The profile's dtype (its `# dtype` header)."""
    element_bytes: float
    """Bytes per parameter in the profile's param_bytes (what its weights are stored in)."""
    weight_bytes: float
    """Weights the forward and backward compute with, per parameter."""
    grad_bytes: float
    """Gradients per parameter (what the data-parallel sync moves)."""
    optimizer_bytes: float
    """Adam's state per parameter: fp32 momentum and variance, plus an fp32 master copy of 16-bit weights."""

    @property
    def bytes_per_param(self) -> float:
        """Weights + gradients + optimizer state per parameter, unsharded."""
        return self.weight_bytes + self.grad_bytes + self.optimizer_bytes


MIXED_BF16 = TrainingPrecision("bfloat16", 2.0, 2.0, 2.0, 12.0)
"""bf16 weights and gradients, fp32 master weights, momentum and variance: 16 bytes per parameter."""
PURE_FP32 = TrainingPrecision("float32", 4.0, 4.0, 4.0, 8.0)
"""fp32 weights, gradients, momentum and variance (no master copy): 16 bytes per parameter."""
DEFAULT_DTYPE = "bfloat16"
"""The dtype of a profile without a `# dtype` line (hand-written): the cluster model's 16-bit default."""


def training_precision(dtype: str) -> TrainingPrecision:
    """The precision a model profiled in `dtype` trains in (module docstring)."""
    if dtype in ("bfloat16", "float16"):
        return replace(MIXED_BF16, dtype=dtype)
    if dtype == "float32":
        return PURE_FP32
    raise PplanError(f"profile dtype {str(dtype)[:40]!r} has no training precision in the cluster model",
                     "profile in float32, bfloat16 or float16 (the profile's `# dtype:` line)")


def profile_dtype(profile: Profile) -> str:
    """The dtype a profile was measured or computed in (DEFAULT_DTYPE when its header has none)."""
    dtype = str(profile.meta.get("dtype") or DEFAULT_DTYPE)
    training_precision(dtype)  # refuse a dtype the model cannot price, naming it
    return dtype


def profile_precision(profile: Profile) -> TrainingPrecision:
    """The training precision of a profile's model: the one place its param_bytes become parameters."""
    return training_precision(profile_dtype(profile))


@dataclass(frozen=True)
class Link2:
    """One link class: bandwidth (bytes/s per direction) and latency per message step (ms)."""

    bandwidth: float
    """Bytes per second per direction."""
    latency_ms: float
    """Latency of one step of a collective, ms."""


@dataclass(frozen=True)
class Placement:
    """Which links each kind of traffic of a (D, P, T) layout uses."""

    tp: Link2
    """Tensor-parallel all-reduces (within a node)."""
    dp: Link2
    """Data-parallel gradient synchronisation."""
    pp: tuple[Link2, ...]
    """Per pipeline boundary s -> s+1 (length P-1)."""


def placement(dp: int, pp: int, tp: int, gpus_per_node: int, intra: Link2, inter: Link2) -> Placement:
    """Links of a layout: rank = t + T*(p + P*d), nodes of `gpus_per_node` consecutive ranks.

    T must divide gpus_per_node. Pipeline boundary s -> s+1 is intra-node when stages s and s+1
    share a node in every replica, else inter-node: the replicas step together, so the slowest
    replica's link is the one the iteration waits for. The data-parallel ring is intra-node only
    when all D*P*T ranks fit in one node (a ring is as slow as its slowest link).
    """
    if gpus_per_node % tp:
        raise PplanError(f"tensor-parallel size {tp} does not divide {gpus_per_node} GPUs per node",
                         "tensor parallelism stays within a node: use a divisor of the GPUs per node")
    pp_links = tuple(inter if _crosses_node(s, dp, pp, gpus_per_node // tp) else intra for s in range(pp - 1))
    return Placement(tp=intra, dp=intra if dp * pp * tp <= gpus_per_node else inter, pp=pp_links)


def _crosses_node(boundary: int, dp: int, pp: int, groups_per_node: int) -> bool:
    """Whether pipeline boundary `boundary` -> +1 crosses a node in any replica: a node holds
    `groups_per_node` whole tensor-parallel groups (group p + P*d = ranks T(p + P*d) ..), so stage
    p + 1 of replica d starts a node when p + 1 + P*d is a multiple of it; P*d mod groups_per_node
    repeats within groups_per_node replicas, so those are enough to look at, whatever D is."""
    return any((boundary + 1 + pp * d) % groups_per_node == 0 for d in range(min(dp, groups_per_node)))


def allreduce_ms(nbytes: Any, ranks: int, link: Link2) -> Any:
    """Ring all-reduce of `nbytes` over `ranks`: 2(r-1) latency + 2(r-1)/r * n / bw, ms (0 for r = 1)."""
    if ranks <= 1:
        return 0.0 * np.asarray(nbytes, dtype=float)
    r = float(ranks)
    return 2 * (r - 1) * link.latency_ms + 2 * (r - 1) / r * np.asarray(nbytes, dtype=float) / link.bandwidth * 1e3


def allgather_ms(nbytes: Any, ranks: int, link: Link2) -> Any:
    """Ring all-gather producing `nbytes` on each of `ranks`: (r-1) latency + (r-1)/r * n / bw, ms."""
    if ranks <= 1:
        return 0.0 * np.asarray(nbytes, dtype=float)
    r = float(ranks)
    return (r - 1) * link.latency_ms + (r - 1) / r * np.asarray(nbytes, dtype=float) / link.bandwidth * 1e3


reduce_scatter_ms = allgather_ms  # ring reduce-scatter of `nbytes` (before scattering): the same steps and bytes


def zero_shares(dp: int, zero: int) -> tuple[float, float, float]:
    """The shares of the unsharded (weights, gradients, optimizer state) that one GPU holds at a
    pipeline stage's memory peak under ZeRO stage `zero` over `dp` replicas, as `pplan run`
    executes it (measured: docs/parallel.md, "How pplan run executes ZeRO").

    Gradients are never divided: a pipeline accumulates them over its micro-batches (torch's
    stages turn FSDP's gradient sync off until the last backward and reduce-scatter once; sharding
    them earlier would cost M times the traffic), even with one micro-batch (conservative). So
    ZeRO-2 divides only the optimizer state, as ZeRO-1, and its weights are 1 + 1/D: FSDP
    (reshard_after_forward=False) keeps the stage's gathered weights beside their shards from the
    first forward to the reduce-scatter. ZeRO-3 divides the weights (the layer computing is
    gathered on top: `zero3_gathered_bytes`). With one replica nothing is sharded."""
    if zero not in (0, 1, 2, 3):
        raise PplanError(f"ZeRO stage must be 0..3, got {zero!r}", "use --zero 0, 1, 2 or 3")
    if dp <= 1 or zero == 0:
        return 1.0, 1.0, 1.0
    shard = 1.0 / float(dp)
    weights = {1: 1.0, 2: 1.0 + shard, 3: shard}[zero]
    return weights, 1.0, shard


def zero_bytes_per_param(dp: int, zero: int, precision: TrainingPrecision) -> float:
    """Static bytes per parameter on one GPU (16 unsharded) under ZeRO stage `zero` over `dp`
    replicas (zero_shares), ZeRO-3's gathered layer not included."""
    w, g, o = zero_shares(dp, zero)
    return precision.weight_bytes * w + precision.grad_bytes * g + precision.optimizer_bytes * o


def zero3_gathered_bytes(param_bytes: Any, dp: int, zero: int) -> np.ndarray:
    """Per layer, the weights ZeRO-3 gathers whole while the layer computes (its forward, its
    backward), in the profile's dtype: alive on top of the GPU's shards at that layer's worst
    moment, so they count as the layer's workspace (planner.cost.workspace_max: one layer at a
    time). Zero for other stages and for one replica."""
    params = np.asarray(param_bytes, dtype=float)
    return params.copy() if zero >= 3 and dp > 1 else np.zeros_like(params)


def grad_sync_ms(grad_bytes: float, dp: int, zero: int, link: Link2) -> float:
    """Per-iteration gradient synchronisation of one stage's `grad_bytes` over `dp` replicas, ms.

    ZeRO 0: all-reduce. ZeRO 1/2: reduce-scatter + all-gather of the updated weights (as many
    bytes as the all-reduce). ZeRO 3: reduce-scatter only (weights are gathered when used).
    """
    if dp <= 1:
        return 0.0
    if zero >= 3:
        return float(reduce_scatter_ms(grad_bytes, dp, link))
    return float(allreduce_ms(grad_bytes, dp, link))


def exposed_sync_ms(sync_ms: float, last_backward_ms: float) -> float:
    """The part of the gradient sync on the critical path: it overlaps the stage's last backward only."""
    return max(0.0, sync_ms - last_backward_ms)


def rank_exposed_sync_ms(stages: Sequence[Any], overlap: bool = True) -> float:
    """The gradient sync of one device's stages (StageCost) left on the critical path: each
    stage's sync overlaps at most that stage's one backward (`exposed_sync_ms`), or none of it."""
    return sum(exposed_sync_ms(st.grad_sync_ms, st.bwd_ms) if overlap else st.grad_sync_ms for st in stages)


def zero3_gather_ms(param_bytes: Any, dp: int, link: Link2) -> Any:
    """ZeRO-3: all-gather of a layer's weights (`param_bytes`, the profile's dtype) over `dp` ranks, once per forward and once per backward, ms."""
    return allgather_ms(param_bytes, dp, link)


def tp_layers(names: tuple[str, ...]) -> np.ndarray:
    """Mask of layers that are transformer blocks (names `block*`); every layer when none is."""
    mask = np.array([n.startswith("block") for n in names], dtype=bool)
    return mask if mask.any() else np.ones(len(names), dtype=bool)


def tp_shards(blocks: np.ndarray, tp: int, vocab_parallel: bool = False) -> np.ndarray:
    """Per layer, what T-way tensor parallelism divides its compute and bytes by on one GPU: T for
    `blocks`, 1 for the rest (whole on every tp rank); T for every layer when `vocab_parallel`."""
    mask = np.ones(len(blocks), dtype=bool) if vocab_parallel else np.asarray(blocks, dtype=bool)
    return np.where(mask, float(tp), 1.0)


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
    """One GPU's share of `costs` under T-way tensor parallelism (and the ZeRO-3 gathers over D).

    Compute (forward, both backward halves, optimizer step), parameter bytes, kept activations
    and what W keeps (wgrad) of every block divide by T, the rest stays whole (as `pplan run`
    executes them; every layer divides under Megatron's `vocab_parallel`: tp_shards);
    `collective_ms` is added to the forward and to the input-gradient backward; under ZeRO-3
    each layer's workspace grows by its gathered weights (zero3_gathered_bytes). Output bytes
    (what a pipeline boundary sends) stay whole, as Megatron (2021) sends them. ZeRO 1+ divides
    the optimizer step by D. `compute_scale` multiplies every compute time (not communication).
    """
    shards = tp_shards(blocks, tp, vocab_parallel)
    t = shards / float(compute_scale)
    comm = collective_ms(costs, blocks, tp, tp_link, dp, zero, dp_link, vocab_parallel)
    fwd = np.asarray(costs.fwd_ms, dtype=float) / t + comm
    bwd_in = np.asarray(costs.bwd_input_ms, dtype=float) / t + comm
    bwd_w = np.asarray(costs.bwd_weight_ms, dtype=float) / t
    opt = np.asarray(costs.optimizer_ms, dtype=float) / t / (dp if zero >= 1 else 1)
    # bytes divide by the shards only: compute_scale is about time (it once scaled these too)
    act, params = (np.asarray(a, dtype=float) / shards for a in (costs.activation_bytes, costs.param_bytes))
    wgrad = None if costs.wgrad_bytes is None else np.asarray(costs.wgrad_bytes, dtype=float) / shards
    workspace = costs.workspace_bytes
    if zero >= 3 and dp > 1:  # the computing layer's gathered weights sit on top of the shards
        base = np.zeros(len(params)) if workspace is None else np.asarray(workspace, dtype=float)
        workspace = base + zero3_gathered_bytes(params, dp, zero)
    return replace(costs, fwd_ms=fwd, bwd_ms=bwd_in + bwd_w, bwd_input_ms=bwd_in, bwd_weight_ms=bwd_w,
                   optimizer_ms=opt, param_bytes=params, activation_bytes=act, workspace_bytes=workspace,
                   wgrad_bytes=wgrad)


def replica_memory(stages: Sequence[Any], peak_activation_bytes: float, dp: int, zero: int,
                   precision: TrainingPrecision) -> MemoryBreakdown:
    """Peak memory of one GPU holding `stages` (StageCost, parameter bytes in the profile's dtype)
    of a replica: weights, gradients and Adam state per parameter as `precision` says, each
    scaled by the share ZeRO leaves on the GPU at the peak (zero_shares), plus the schedule's
    activations (ZeRO-3's gathered layer is in them, as its workspace) and the boundary buffers."""
    n_params = sum(st.param_bytes for st in stages) / precision.element_bytes
    w, g, o = zero_shares(dp, zero)
    return MemoryBreakdown(
        weights=n_params * precision.weight_bytes * w,
        gradients=n_params * precision.grad_bytes * g,
        optimizer=n_params * precision.optimizer_bytes * o,
        activations=peak_activation_bytes,
        buffers=sum(st.buffer_bytes for st in stages),
    )


def gpt_model_flops(batch: int, seq: int, layers: int, hidden: int, vocab: int, recompute: bool, ffn: int = 4) -> float:
    """Model FLOPs of one iteration of a GPT over `batch` samples whose MLP is `ffn` x `hidden`
    wide: Narayanan et al. (SC21, eq. 3) for any width (module docstring; ffn = 4 is the paper's)."""
    B, s, l, h, V, f = float(batch), float(seq), float(layers), float(hidden), float(vocab), float(ffn)
    passes = 4.0 if recompute else 3.0  # forward + backward (2 forwards' worth), + the forward again
    block = passes * (2.0 * (4.0 + 2.0 * f) * h * h + 4.0 * s * h)
    return B * s * (l * block + 6.0 * h * V)  # the head is never recomputed: 3 x its 2 h V


@dataclass(frozen=True)
class ModelFlops:
    """Model FLOPs of one iteration over the global batch, counted as Narayanan et al. (2021) do."""

    plain: float
    """Forward + backward (what MFU counts)."""
    recomputed: float
    """Forward + backward + the forward run again under full recompute."""
    tokens_per_sample: int
    """Sequence length of a gpt profile, 1 otherwise."""
    source: str
    """How the FLOPs were counted."""
    dtype: str
    """The profile's dtype, which the model trains in: MFU divides by the hardware's peak in it
    (Hardware.peak_flops_per_s), and its parameters' bytes follow training_precision."""

    @property
    def precision(self) -> TrainingPrecision:
        """Bytes per parameter of the model's training state (training_precision of its dtype)."""
        return training_precision(self.dtype)

    def achieved(self, recompute: bool) -> float:
        """The FLOPs that achieved TFLOP/s per GPU counts: recomputed forwards included when recomputing."""
        return self.recomputed if recompute else self.plain


def _gpt_params(profile: Profile) -> dict | None:
    try:
        kind, params = parse_spec(profile.meta.get("model", ""))
    except (ModelSpecError, PplanError):
        return None
    return params if kind == "gpt" else None


def model_flops(profile: Profile, global_batch: int) -> ModelFlops:
    """FLOPs of one iteration of `global_batch` samples: eq. 3 of Narayanan et al. for a gpt
    profile (its MLP width `ffn` included), else 3 x the profile's `flops` column (forward) per sample, else zero (unknown);
    with the profile's dtype (profile_dtype)."""
    dtype = profile_dtype(profile)
    gpt = _gpt_params(profile)
    if gpt is not None:
        args = (global_batch, gpt["seq"], gpt["layers"], gpt["hidden"], gpt["vocab"])
        ffn = int(gpt["ffn"])
        return ModelFlops(gpt_model_flops(*args, False, ffn), gpt_model_flops(*args, True, ffn), int(gpt["seq"]),
                          "Narayanan et al. 2021, eq. 3" + ("" if ffn == 4 else f" for an MLP {ffn} x hidden wide"), dtype)
    if "flops" in profile.present:
        fwd = float(np.sum(profile.columns["flops"][:, 0])) / profile.micro_batch_sizes[0] * global_batch
        return ModelFlops(3.0 * fwd, 4.0 * fwd, 1, "profile flops column: 3 x forward (+1 x forward recomputed)", dtype)
    return ModelFlops(0.0, 0.0, 1, "none (the profile has no flops column)", dtype)


def checked_mfu(mfu: float, peak_flops_per_s: float, hardware: str) -> float:
    """`mfu` (model FLOPs / (iteration time x GPUs x peak)) when at most 1. Above, each GPU would
    beat `hardware`'s peak: the profile's times and the hardware disagree (a profile made for
    faster hardware, a peak with the wrong unit), so PplanError rather than a plan."""
    if mfu <= 1.0:
        return mfu
    raise PplanError(f"predicted MFU {100 * mfu:.4g}% is above 100%: {mfu * peak_flops_per_s:.4g} FLOP/s of model FLOPs per GPU "
                     f"against the {peak_flops_per_s:.4g} FLOP/s peak of {hardware}",
                     "the profile's times are faster than this hardware: plan with the hardware the profile was made on, "
                     "or give the device's real peak in FLOP/s (e.g. 9.89e14)")
