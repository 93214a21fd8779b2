"""The kernels a tensor-parallel block runs whole on every rank (its two layer norms, two residual
adds and the row-parallel biases' gradients) do not divide by T: planner.cost.tensor_parallel prices
them from the block's output bytes at the hardware's memory-bound bandwidth, the rest / T.

Held against an independent roofline of what one tp rank of Megatron's split block runs: the QKV and
FC1 GEMMs T times narrower, the projection and FC2 T times shallower, the attention over 1/T of the
heads, GELU on 1/T of the inner activations, the norms and residual adds whole. For an analytic
profile without per-kernel overhead, with GEMMs sized so that their efficiency does not change with
T, the two agree to the profile's 6 significant digits. Dividing the whole block by T (what the model did before) was 6% fast
for hidden 12288 at T = 8 by the same roofline, and more for smaller models."""

from __future__ import annotations

import numpy as np
import pytest

from planner.cost.collectives import Link2
from planner.cost.tensor_parallel import collective_ms, tensor_parallel_costs, tp_layers
from planner.hardware import DTYPE_BYTES, MEMORY_BOUND_FRACTION, PRESETS
from planner.profiling.analytic import Efficiency, analytic_profile

HW = PRESETS["a100-80gb"]
NO_OVERHEAD = Efficiency(kernel_overhead_ms=0.0)
FREE_LINK = Link2(1e15, 0.0)  # the collectives are another term: left out here


def _split_block_ms(b: int, s: int, h: int, heads: int, ffn: int, tp: int, dtype: str) -> tuple[float, float, float]:
    """(forward, input-gradient, weight-gradient) ms of one tp rank of a pre-LN block, kernel by kernel."""
    dt, eff = DTYPE_BYTES[dtype], NO_OVERHEAD
    peak, bw = HW.peak_flops_per_s(dtype), HW.memory_bandwidth_bytes_per_s * MEMORY_BOUND_FRACTION
    t, x = b * s, b * s * h * dt
    f = i = w = 0.0

    def kernel(flops: float, nbytes: float, efficiency: float) -> float:
        return 1e3 * max(flops / (peak * efficiency) if flops else 0.0, nbytes / bw)

    def gemm(m: int, n: int, k: int) -> None:
        nonlocal f, i, w
        ms = kernel(2.0 * m * n * k, (m * k + k * n + m * n) * dt, eff.gemm(m, n, k))
        f, i, w = f + ms, i + ms, w + ms + 1e3 * m * n * dt / bw  # its bias's gradient reads dY

    def memory(fwd_bytes: float, bwd_bytes: float) -> None:
        nonlocal f, i
        f, i = f + fwd_bytes / bw * 1e3, i + bwd_bytes / bw * 1e3

    d = h // heads
    memory(2 * x, 3 * x)                                     # ln1, whole
    gemm(t, 3 * h // tp, h)                                  # QKV, column-parallel
    att_flops, att_bytes = 4.0 * b * (heads // tp) * s * s * d * eff.causal_attention_work, 4.0 * b * s * (heads // tp) * d * dt
    f += kernel(att_flops, att_bytes, eff.gemm(s, s, d))
    i += kernel(2 * att_flops, 2 * att_bytes, eff.gemm(s, s, d))
    gemm(t, h, h // tp)                                      # projection, row-parallel: its bias whole
    memory(3 * x, 3 * x)                                     # residual add, whole
    memory(2 * x, 3 * x)                                     # ln2, whole
    gemm(t, ffn * h // tp, h)                                # FC1, column-parallel
    memory(2 * ffn * x / tp, 3 * ffn * x / tp)               # GELU on this rank's share
    gemm(t, h, ffn * h // tp)                                # FC2, row-parallel: its bias whole
    memory(3 * x, 3 * x)                                     # residual add, whole
    return f, i, w


@pytest.mark.parametrize("h, heads, tp", [(2048, 16, 2), (2048, 16, 4), (4096, 32, 8)])
def test_a_blocks_tp_share_is_the_roofline_of_megatrons_split_block(h, heads, tp):
    # 512 tokens a micro-batch: every GEMM's smallest dimension stays 512 after the split (h / T >= 512),
    # so its efficiency, and so its time / T, is the roofline's
    b, s, dtype = 4, 128, "bfloat16"
    prof = analytic_profile(f"gpt:layers=2,hidden={h},heads={heads},seq={s},vocab=1024", HW, dtype, [b],
                            efficiency=NO_OVERHEAD)
    costs = prof.at(b)
    blocks = tp_layers(prof.names)
    share = tensor_parallel_costs(costs, blocks, tp, FREE_LINK,
                                  memory_bytes_per_s=HW.memory_bandwidth_bytes_per_s * MEMORY_BOUND_FRACTION)
    want = _split_block_ms(b, s, h, heads, 4, tp, dtype)
    comm = collective_ms(costs, blocks, tp, FREE_LINK)[1]  # in the forward and the input gradient
    got = (share.fwd_ms[1] - comm, share.bwd_input_ms[1] - comm, share.bwd_weight_ms[1])
    assert got == pytest.approx(want, rel=1e-5)  # a profile holds times to 6 significant digits
    # the whole block / T, as before, is faster than what the rank runs
    assert costs.fwd_ms[1] / tp < 0.97 * want[0]
    # layers that are no block (embedding, head) stay whole, as pplan run keeps them
    assert share.fwd_ms[0] == pytest.approx(costs.fwd_ms[0]) and share.fwd_ms[-1] == pytest.approx(costs.fwd_ms[-1])


def test_without_a_bandwidth_every_part_divides_and_the_whole_part_never_exceeds_the_block():
    b, s = 4, 128
    prof = analytic_profile(f"gpt:layers=2,hidden=2048,heads=16,seq={s},vocab=1024", HW, "bfloat16", [b],
                            efficiency=NO_OVERHEAD)
    costs, blocks = prof.at(b), tp_layers(prof.names)
    plain = tensor_parallel_costs(costs, blocks, 4, FREE_LINK)
    comm = collective_ms(costs, blocks, 4, FREE_LINK)
    assert np.allclose(plain.fwd_ms[1:-1] - comm[1:-1], costs.fwd_ms[1:-1] / 4, rtol=1e-12, atol=0)
    crawl = tensor_parallel_costs(costs, blocks, 4, FREE_LINK, memory_bytes_per_s=1.0)  # every byte takes forever
    assert np.allclose(crawl.fwd_ms - comm, costs.fwd_ms, rtol=1e-12, atol=0)
    assert np.allclose(crawl.bwd_input_ms - comm, costs.bwd_input_ms, rtol=1e-12, atol=0)
