"""Analytic profiles: per-layer costs of the built-in gpt on hardware you do not have.

`analytic_profile(spec, hardware, dtype, sizes)` writes nothing and runs nothing: it lays the
`gpt:` spec out exactly as planner.models.gpt builds it (embed, block0..N-1, norm_head; the
same names, parameter counts and output sizes) and prices every kernel of every layer with a
roofline (docs/hardware.md has the formulas):

    time(kernel) = overhead + max(flops / (peak(dtype) * eff_gemm), bytes / (mem_bw * eff_mem))
    eff_gemm     = ceiling * d / (d + d_half),  d = the GEMM's smallest dimension (m, n or k)

A GEMM's backward is two GEMMs of its forward's size: dX (the input gradient, zero-bubble I)
and dW (the weight gradient, W, plus the bias gradient's reduction); attention has no weights,
its backward (twice the forward FLOPs) is all input gradient. Memory-bound kernels (LayerNorm,
GELU, residual adds, embedding gathers, the loss) cost the bytes they read and write.

Columns: `flops` counts what torch.utils.flop_counter counts (matmuls and attention, causal
or not), so measured and analytic profiles agree on it; parameter, output and (with
activations="flash") activation bytes equal what `pplan profile` measures on the built-in gpt.
Activation bytes per block follow Korthikanti et al. (2022): "korthikanti" is their formula,
s*b*h*(34 + 5*a*s/h) bytes at 16-bit (dropout masks and stored attention scores included);
"flash" (the default) is the same accounting without dropout and with fused attention, which
is what the built-in gpt (no dropout, scaled_dot_product_attention) keeps: (8 + 2*ffn)*s*b*h
elements plus LayerNorm statistics and the attention's logsumexp. Of those tensors, 4 are the
block's input size and stay whole on every rank under tensor parallelism without sequence
parallelism (the two norms' inputs and outputs); planner.cost.tensor_parallel prices that from the
profile's columns (4 x output_bytes), so it holds for measured profiles too.

`wgrad_bytes` is what zero-bubble's I keeps per micro-batch for its W, as `pplan profile` measures
it (planner.profiling.split_backward): the gradients arriving at the nodes where a
weight's path meets the input's, one storage each, in the parameters' dtype. A block holds those of
ln1's output (h), QKV's (3h), the projection's (h: the residual gradient after attention), ln2's (h),
FC1's (ffn*h: GELU's input gradient) and FC2's (h: the block's output gradient, which is the next
layer's input gradient or the received one): (7 + ffn)*s*b*h elements. norm_head holds its LayerNorm
output's gradient (h) and the logits' (vocab, cast back to the dtype): (h + vocab)*s*b elements. The
embedding holds none: its input (token ids) has no gradient, and torch runs a first stage's whole
backward at W.

`w_workspace_bytes` and `w_carry_bytes` are what torch's W holds while it runs (planner.profiling.
split_backward): it makes the weight gradients one parameter group at a time, in the parameters'
order, keeping the previous group's while it makes the next. A block's groups are ln1 (2h), QKV
(3h^2 + 3h), proj (h^2 + h), ln2 (2h), FC1 (f*h^2 + f*h) and FC2 (f*h^2 + h) elements: its
workspace is the largest sum of two consecutive groups (FC1 + FC2 for f >= 3, QKV + proj below),
its carry FC2's. norm_head's groups are its LayerNorm (2h) and the head (vocab*h): workspace
(vocab + 2)*h, carry vocab*h. The embedding holds none (a first layer, as above). In the parameters'
dtype, at every micro-batch size: as float32 profiles measure them on a CPU, and a GPU's GEMMs keep
their workspace between calls; a 16-bit profile measured on a CPU adds oneDNN's GEMM scratch, which
depends on the thread count (docs/hardware.md).

No torch: planning machines can write analytic profiles.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from planner.errors import ModelSpecError, PplanError
from planner.hardware import DTYPE_BYTES, MEMORY_BOUND_FRACTION, Hardware, load_hardware
from planner.cost.precision import training_precision
from planner.models.spec import parse_spec
from planner.profiling.profile import Profile, make_profile, write_profile

__all__ = ["ACTIVATION_MODELS", "Efficiency", "DEFAULT_EFFICIENCY", "analytic_profile", "write_analytic_profile"]

ACTIVATION_MODELS = ("flash", "korthikanti")
_MAX_SIZES = 64
_MAX_MICRO_BATCH = 1 << 20


@dataclass(frozen=True)
class Efficiency:
    """How close kernels come to the hardware's peaks (docs/hardware.md, 'Efficiency model')."""

    gemm_ceiling: float = 0.75
    """Fraction of peak FLOP/s that large GEMMs reach (60-80% on A100/H100; 77% measured on one CPU core)."""
    gemm_half_dim: float = 64.0
    """Smallest GEMM dimension at which a GEMM reaches half the ceiling."""
    memory_fraction: float = MEMORY_BOUND_FRACTION
    """Fraction of peak memory bandwidth that memory-bound kernels reach."""
    kernel_overhead_ms: float = 0.005
    """Fixed cost of every kernel (launch, tail), ms."""
    causal_attention_work: float = 0.5
    """Share of the attention matmuls a causal fused kernel computes (it skips the masked half)."""

    def gemm(self, m: float, n: float, k: float) -> float:
        """Fraction of peak an (m x k) @ (k x n) GEMM reaches."""
        d = min(m, n, k)
        return self.gemm_ceiling * d / (d + self.gemm_half_dim)

    def describe(self) -> str:
        """One line for profile metadata."""
        return (f"roofline, gemm {self.gemm_ceiling:g}*d/(d+{self.gemm_half_dim:g}) of peak (d = smallest dimension), "
                f"memory {self.memory_fraction:g} of peak bandwidth, {self.kernel_overhead_ms * 1000:g} us per kernel, "
                f"causal attention {self.causal_attention_work:g} of its matmuls")


DEFAULT_EFFICIENCY = Efficiency()


class _Layer:
    """Accumulates one layer's forward, input-gradient and weight-gradient time (ms) kernel by kernel."""

    def __init__(self, peak: float, bandwidth: float, dt: int, eff: Efficiency):
        self.peak, self.bandwidth, self.dt, self.eff = peak, bandwidth, dt, eff
        self.fwd = self.bwd_input = self.bwd_weight = 0.0

    def _kernel(self, flops: float, nbytes: float, efficiency: float) -> float:
        compute = flops / (self.peak * efficiency) if flops else 0.0
        return self.eff.kernel_overhead_ms + 1e3 * max(compute, nbytes / self.bandwidth)

    def gemm(self, m: int, n: int, k: int, bias: bool) -> None:
        """Y = X W (+ b): X (m x k), W (k x n); backward dX = dY W^T (I) and dW = X^T dY (W)."""
        t = self._kernel(2.0 * m * n * k, (m * k + k * n + m * n) * self.dt, self.eff.gemm(m, n, k))
        self.fwd += t
        self.bwd_input += t
        self.bwd_weight += t + (1e3 * m * n * self.dt / self.bandwidth if bias else 0.0)

    def attention(self, b: int, a: int, s: int, d: int) -> None:
        """Fused causal attention over b*a heads: Q K^T and P V, read q, k, v, write o."""
        flops = 4.0 * b * a * s * s * d * self.eff.causal_attention_work
        nbytes = 4.0 * b * s * a * d * self.dt
        eff = self.eff.gemm(s, s, d)
        self.fwd += self._kernel(flops, nbytes, eff)
        self.bwd_input += self._kernel(2 * flops, 2 * nbytes, eff)  # read q, k, v, o, dO; write dq, dk, dv

    def memory(self, fwd_bytes: float, bwd_input_bytes: float = 0.0, bwd_weight_bytes: float = 0.0) -> None:
        """A memory-bound kernel: forward and backward bytes read plus written."""
        for attr, nbytes in (("fwd", fwd_bytes), ("bwd_input", bwd_input_bytes), ("bwd_weight", bwd_weight_bytes)):
            if nbytes:
                setattr(self, attr, getattr(self, attr) + self._kernel(0.0, nbytes, 1.0))


def _check(dtype: str, sizes: Sequence[int], activations: str) -> list[int]:
    if dtype not in DTYPE_BYTES:
        raise PplanError(f"dtype {dtype!r} is not supported", f"use one of {', '.join(DTYPE_BYTES)}")
    if activations not in ACTIVATION_MODELS:
        raise PplanError(f"activation model {activations!r} is not known", f"use one of {', '.join(ACTIVATION_MODELS)}")
    if (not sizes or len(sizes) > _MAX_SIZES or len(set(sizes)) != len(sizes)
            or any(isinstance(s, bool) or not isinstance(s, int) or not 1 <= s <= _MAX_MICRO_BATCH for s in sizes)):
        raise PplanError(f"micro-batch sizes {list(sizes)[:8]} must be 1 to {_MAX_SIZES} distinct integers in 1..{_MAX_MICRO_BATCH}", "e.g. 1,2,4,8")
    return sorted(sizes)


def _gpt_params(spec: str) -> dict[str, int]:
    kind, p = parse_spec(spec)
    if kind != "gpt":
        raise ModelSpecError(f"analytic profiles cover the built-in gpt only, not {spec!r}",
                             "write a gpt:layers=..,hidden=..,heads=..,seq=..,vocab=.. spec, or measure this model with `pplan profile`")
    return p


def analytic_profile(
    spec: str,
    hardware: Hardware | str,
    dtype: str,
    micro_batch_sizes: Sequence[int],
    *,
    efficiency: Efficiency = DEFAULT_EFFICIENCY,
    activations: str = "flash",
    command: str | None = None,
    seed: int = 0,
) -> Profile:
    """A profile of the built-in gpt `spec` on `hardware` (a Hardware, preset name or JSON path), computed.

    Same layers, names and format as `pplan profile --model spec --dtype dtype`; metadata
    `analytic: true`, `hardware: NAME` and `source` (the efficiency and activation models)
    say how it was made;
    `command` (the command line, if any) is recorded like `pplan profile` does.
    """
    hw = hardware if isinstance(hardware, Hardware) else load_hardware(hardware)
    sizes = _check(dtype, micro_batch_sizes, activations)
    p = _gpt_params(spec)
    L, h, a, s, V, f = p["layers"], p["hidden"], p["heads"], p["seq"], p["vocab"], p["ffn"]
    dt, d = DTYPE_BYTES[dtype], h // a
    peak, bandwidth = hw.peak_flops_per_s(dtype), hw.memory_bandwidth_bytes_per_s * efficiency.memory_fraction
    names = ["embed"] + [f"block{i}" for i in range(L)] + ["norm_head"]
    n, k_sizes = len(names), len(sizes)
    cols = {c: np.zeros((n, k_sizes)) for c in (
        "fwd_ms", "bwd_ms", "bwd_input_ms", "bwd_weight_ms", "activation_bytes", "output_bytes", "flops", "wgrad_bytes")}
    cols["w_workspace_bytes"], cols["w_carry_bytes"] = _weight_backward_bytes(L, h, f, V, dt, k_sizes)
    params = np.array([(V + s) * h] + [(4 + 2 * f) * h * h + (9 + f) * h] * L + [V * h + 2 * h], dtype=float)

    for k, b in enumerate(sizes):
        T = b * s  # tokens per micro-batch
        layers = [_embed(T, s, h, V, dt, peak, bandwidth, efficiency)]
        block = _block(b, s, h, a, d, f, dt, peak, bandwidth, efficiency)
        layers += [block] * L
        layers.append(_norm_head(T, h, V, dt, peak, bandwidth, efficiency))
        for i, layer in enumerate(layers):
            cols["fwd_ms"][i, k] = layer.fwd
            cols["bwd_input_ms"][i, k] = layer.bwd_input
            cols["bwd_weight_ms"][i, k] = layer.bwd_weight
        cols["flops"][:, k] = [0.0] + [2.0 * T * (4 + 2 * f) * h * h + 4.0 * b * s * s * h] * L + [2.0 * T * h * V]
        cols["activation_bytes"][:, k] = _activation_bytes(activations, L, b, s, h, a, f, V, dt)
        cols["output_bytes"][:, k] = [T * h * dt] * (L + 1) + [T * V * dt]
        cols["wgrad_bytes"][:, k] = [0.0] + [(7 + f) * T * h * dt] * L + [(h + V) * T * dt]
    cols["bwd_ms"] = cols["bwd_input_ms"] + cols["bwd_weight_ms"]
    # Adam, fused, at memory speed: traffic from the training precision (the same 28 bytes per parameter
    # in fp32 and in mixed precision, whose fp32 master copy and moments dominate it)
    opt = efficiency.kernel_overhead_ms + 1e3 * training_precision(dtype).adam_step_bytes * params / bandwidth
    cols["optimizer_ms"] = np.repeat(opt[:, None], k_sizes, axis=1)
    cols["param_bytes"] = np.repeat(params[:, None] * dt, k_sizes, axis=1)
    source = f"planner.profiling.analytic: {efficiency.describe()}; activations {activations}"
    return make_profile(names, sizes, cols, _meta(spec, dtype, s, hw.name, source, seed, command))


def _meta(spec: str, dtype: str, seq: int, hardware: str, source: str, seed: int, command: str | None) -> dict[str, str]:
    """The profile's metadata lines: what `pplan profile` records, and how this one was computed."""
    meta = {
        "model": spec,
        "seed": str(seed),  # nothing here is random; plans take it as the weights' seed for `pplan run`
        "dtype": dtype,
        "input_bytes_per_sample": str(8 * seq),
        "analytic": "true",
        "hardware": hardware,
        "source": source,
    }
    if command:
        meta["command"] = " ".join(command.splitlines())
    return meta


def _weight_backward_bytes(L: int, h: int, f: int, V: int, dt: int, k_sizes: int) -> tuple[np.ndarray, np.ndarray]:
    """(w_workspace_bytes, w_carry_bytes) of embed, L blocks and norm_head (module docstring), the
    same at every micro-batch size: the largest sum of two consecutive parameter groups' gradients,
    and the last group's."""
    block = [2 * h, 3 * h * h + 3 * h, h * h + h, 2 * h, f * h * h + f * h, f * h * h + h]  # ln1 qkv proj ln2 fc1 fc2
    head = [2 * h, V * h]  # ln, head
    workspace = [0] + [max(a + b for a, b in zip(block, block[1:]))] * L + [head[0] + head[1]]
    carry = [0] + [block[-1]] * L + [head[-1]]
    return tuple(np.repeat(np.array(col, dtype=float)[:, None] * dt, k_sizes, axis=1) for col in (workspace, carry))


def _activation_bytes(activations: str, L: int, b: int, s: int, h: int, a: int, f: int, V: int, dt: int) -> list[float]:
    """Bytes each layer keeps for backward at micro-batch b: embed, L blocks, norm_head."""
    T = b * s
    if activations == "flash":  # (8 + 2f) tensors of T x h, LayerNorm mean/rstd and logsumexp in fp32
        block_act = (8 + 2 * f) * T * h * dt + 16 * T + 4 * b * a * s
    else:  # Korthikanti et al.: + dropout masks (1 byte) + attention scores, softmax and its dropout
        block_act = (8 + 2 * f) * T * h * dt + 2 * T * h + (2 * dt + 1) * b * a * s * s
    # embed keeps the token ids and positions (int64); norm_head its LayerNorm input and
    # statistics, the head's input, the fp32 log-softmax, the int64 targets and nll's total weight
    head_act = 2 * T * h * dt + 8 * T + 4 * T * V + 8 * T + 4
    return [8 * T + 8 * s] + [block_act] * L + [head_act]


def _embed(T: int, s: int, h: int, V: int, dt: int, peak: float, bw: float, eff: Efficiency) -> _Layer:
    layer = _Layer(peak, bw, dt, eff)
    # token rows: read ids and rows, write; backward zero-fills the dense V x h gradient and scatter-adds
    layer.memory(T * 8 + 2 * T * h * dt, bwd_weight_bytes=(V * h + 3 * T * h) * dt + T * 8)
    # position rows, then the broadcast add; backward sums the gradient over the batch
    layer.memory(2 * s * h * dt, bwd_weight_bytes=(2 * s * h + T * h) * dt)
    layer.memory((2 * T * h + s * h) * dt)
    return layer


def _block(b: int, s: int, h: int, a: int, d: int, f: int, dt: int, peak: float, bw: float, eff: Efficiency) -> _Layer:
    T = b * s
    x = T * h * dt  # one activation tensor
    layer = _Layer(peak, bw, dt, eff)
    layer.memory(2 * x, 3 * x)                 # ln1: read x, write; backward read x, dy, write dx
    layer.gemm(T, 3 * h, h, bias=True)         # qkv
    layer.attention(b, a, s, d)
    layer.gemm(T, h, h, bias=True)             # proj
    layer.memory(3 * x, 3 * x)                 # residual add; backward accumulates the two gradients
    layer.memory(2 * x, 3 * x)                 # ln2
    layer.gemm(T, f * h, h, bias=True)         # fc1
    layer.memory(2 * f * x, 3 * f * x)         # gelu
    layer.gemm(T, h, f * h, bias=True)         # fc2
    layer.memory(3 * x, 3 * x)                 # residual add
    return layer


def _norm_head(T: int, h: int, V: int, dt: int, peak: float, bw: float, eff: Efficiency) -> _Layer:
    layer = _Layer(peak, bw, dt, eff)
    layer.memory(2 * T * h * dt, 3 * T * h * dt)   # final LayerNorm
    layer.gemm(T, V, h, bias=False)                # LM head
    cast = (dt + 4) * T * V if dt != 4 else 0      # logits.float() (a no-op in float32)
    layer.memory(8 * T * V + cast, 8 * T * V + cast)  # log-softmax and its backward, cast back
    return layer


def write_analytic_profile(
    model_spec: str,
    hardware: str,
    dtype: str,
    micro_batch_sizes: list[int],
    out_path: str | os.PathLike,
    *,
    activations: str = "flash",
    command: str | None = None,
    seed: int = 0,
) -> Profile:
    """`analytic_profile` written atomically to `out_path`; returns it with path and sha256 set."""
    profile = analytic_profile(model_spec, hardware, dtype, micro_batch_sizes, activations=activations, command=command,
                               seed=seed)
    sha = write_profile(profile, out_path)
    return replace(profile, path=str(out_path), sha256=sha)
