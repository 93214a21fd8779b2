"""planner.cost.parallel (data/tensor-parallel terms) and planner.parallel.ParallelConfig."""

import math

import numpy as np
import pytest

from planner.cost.parallel import (
    MIXED_BF16, PURE_FP32, Link2, allgather_ms, allreduce_ms, exposed_sync_ms, gpt_model_flops, grad_sync_ms, placement,
    model_flops, tensor_parallel_costs, tp_layers, zero_bytes_per_param, zero_shares,
)
from planner.errors import PplanError
from planner.parallel import ParallelConfig, parse_parallel
from planner.profiling.analytic import analytic_profile

INTRA, INTER = Link2(300e9, 0.01), Link2(25e9, 0.02)


def test_ring_collectives_follow_the_textbook_formulas():
    n = 1e9
    assert allreduce_ms(n, 1, INTRA) == 0.0
    assert allreduce_ms(n, 8, INTRA) == pytest.approx(2 * 7 * 0.01 + 2 * 7 / 8 * n / 300e9 * 1e3)
    assert allgather_ms(n, 4, INTER) == pytest.approx(3 * 0.02 + 3 / 4 * n / 25e9 * 1e3)
    # an all-reduce moves twice an all-gather's bytes
    assert allreduce_ms(n, 4, Link2(1e9, 0.0)) == pytest.approx(2 * allgather_ms(n, 4, Link2(1e9, 0.0)))


def test_zero_stages_divide_optimizer_then_weights_never_accumulated_gradients():
    # a pipeline accumulates gradients whole over its micro-batches (torch's stages reduce-scatter
    # once, at the last backward), so ZeRO-2 shards what ZeRO-1 shards, and FSDP holds its
    # gathered stage beside the shards (weights 1 + 1/D, measured: docs/parallel.md)
    assert MIXED_BF16.bytes_per_param == PURE_FP32.bytes_per_param == 16
    assert zero_bytes_per_param(8, 0, MIXED_BF16) == 16
    assert zero_bytes_per_param(8, 1, MIXED_BF16) == pytest.approx(2 + 2 + 12 / 8)
    assert zero_bytes_per_param(8, 2, MIXED_BF16) == pytest.approx(2 * (1 + 1 / 8) + 2 + 12 / 8)
    assert zero_bytes_per_param(8, 3, MIXED_BF16) == pytest.approx(2 / 8 + 2 + 12 / 8)
    assert zero_bytes_per_param(8, 1, PURE_FP32) == pytest.approx(4 + 4 + 8 / 8)
    assert zero_bytes_per_param(1, 3, MIXED_BF16) == zero_bytes_per_param(1, 2, MIXED_BF16) == 16
    assert zero_shares(2, 2) == (1.5, 1.0, 0.5) and zero_shares(2, 3) == (0.5, 1.0, 0.5)
    with pytest.raises(PplanError):
        zero_bytes_per_param(2, 4, MIXED_BF16)


def test_grad_sync_and_overlap():
    g = 4e9
    assert grad_sync_ms(g, 1, 0, INTER) == 0.0
    # pplan run all-reduces whole gradients under ZeRO 0 and 1 (ZeroRedundancyOptimizer shards
    # only the state); FSDP (ZeRO 2, 3) reduce-scatters once after the stage's last backward
    assert grad_sync_ms(g, 8, 0, INTER) == grad_sync_ms(g, 8, 1, INTER) == pytest.approx(allreduce_ms(g, 8, INTER))
    assert grad_sync_ms(g, 8, 2, INTER) == grad_sync_ms(g, 8, 3, INTER) == pytest.approx(allgather_ms(g, 8, INTER))
    # overlap is the caller's explicit choice: pplan run overlaps nothing
    assert exposed_sync_ms(10.0, 4.0, overlap=True) == 6.0 and exposed_sync_ms(3.0, 4.0, overlap=True) == 0.0
    assert exposed_sync_ms(10.0, 4.0, overlap=False) == 10.0


def test_placement_tp_in_node_pipeline_then_data_outermost():
    p = placement(dp=2, pp=4, tp=2, gpus_per_node=8, intra=INTRA, inter=INTER)
    assert p.tp == INTRA and p.pp == (INTRA, INTRA, INTRA) and p.dp == INTER
    p = placement(dp=1, pp=4, tp=4, gpus_per_node=8, intra=INTRA, inter=INTER)
    assert p.pp == (INTRA, INTER, INTRA)  # stages 0,1 on node 0; 2,3 on node 1
    assert placement(dp=2, pp=2, tp=2, gpus_per_node=8, intra=INTRA, inter=INTER).dp == INTRA
    # dp=4, pp=3, tp=2 on 3 nodes of 8: replica 0 sits in node 0, but replica 1's stages 0 | 1 and
    # replica 2's stages 1 | 2 straddle nodes, and the step waits for the slowest replica
    assert placement(dp=4, pp=3, tp=2, gpus_per_node=8, intra=INTRA, inter=INTER).pp == (INTER, INTER)
    with pytest.raises(PplanError, match="divide"):
        placement(dp=1, pp=1, tp=3, gpus_per_node=8, intra=INTRA, inter=INTER)


def test_gpt_model_flops_is_narayanan_eq3():
    B, s, l, h, V = 1536, 2048, 96, 12288, 51200
    plain = gpt_model_flops(B, s, l, h, V, recompute=False)
    assert plain == pytest.approx(72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h)))
    rec = gpt_model_flops(B, s, l, h, V, recompute=True)
    assert rec == pytest.approx(96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h)))
    # about 6 x params x tokens without recompute (175B parameters)
    assert plain / (6 * 175e9 * B * s) == pytest.approx(1.0, rel=0.1)


def test_tensor_parallel_costs_divide_compute_and_add_block_allreduces():
    prof = analytic_profile("gpt:layers=4,hidden=1024,heads=16,seq=512,vocab=8192", "a100-80gb", "bfloat16", [2])
    c = prof.at(2)
    blocks = tp_layers(prof.names)
    assert blocks.tolist() == [False, True, True, True, True, False]
    t4 = tensor_parallel_costs(c, blocks, 4, INTRA)
    comm = 2 * allreduce_ms(c.output_bytes[1], 4, INTRA)  # two all-reduces of b*s*h
    assert c.output_bytes[1] == 2 * 512 * 1024 * 2
    assert t4.fwd_ms[1] == pytest.approx(c.fwd_ms[1] / 4 + comm)
    assert t4.bwd_input_ms[1] == pytest.approx(c.bwd_input_ms[1] / 4 + comm)
    assert t4.bwd_weight_ms[1] == pytest.approx(c.bwd_weight_ms[1] / 4)
    # pplan run keeps the embedding and the final norm + head whole on every tp rank: no division, no all-reduce
    for whole in (0, 5):
        assert t4.fwd_ms[whole] == pytest.approx(c.fwd_ms[whole])
        assert t4.bwd_ms[whole] == pytest.approx(c.bwd_ms[whole])
        assert t4.optimizer_ms[whole] == pytest.approx(c.optimizer_ms[whole])
    np.testing.assert_allclose(t4.bwd_ms, t4.bwd_input_ms + t4.bwd_weight_ms)
    np.testing.assert_allclose(t4.param_bytes, np.where(blocks, c.param_bytes / 4, c.param_bytes))
    # no sequence parallelism: a block keeps 4 x its output whole (tests/test_tp_activations.py)
    kept = 4 * c.output_bytes + (c.activation_bytes - 4 * c.output_bytes) / 4
    np.testing.assert_allclose(t4.activation_bytes, np.where(blocks, kept, c.activation_bytes))
    np.testing.assert_allclose(t4.output_bytes, c.output_bytes)
    # Megatron's vocabulary split (vocab_parallel, for published runs) divides every layer
    mega = tensor_parallel_costs(c, blocks, 4, INTRA, vocab_parallel=True)
    np.testing.assert_allclose(mega.param_bytes, c.param_bytes / 4)
    assert mega.fwd_ms[0] == pytest.approx(c.fwd_ms[0] / 4) and mega.fwd_ms[1] == pytest.approx(t4.fwd_ms[1])
    one = tensor_parallel_costs(c, blocks, 1, INTRA)
    np.testing.assert_allclose(one.fwd_ms, c.fwd_ms)
    z3 = tensor_parallel_costs(c, blocks, 1, INTRA, dp=8, zero=3, dp_link=INTER)
    assert z3.fwd_ms[1] == pytest.approx(c.fwd_ms[1] + allgather_ms(c.param_bytes[1], 8, INTER))
    # ZeRO-3: a computing layer's gathered weights (per tensor-parallel rank) are its workspace
    own = np.zeros(len(c.param_bytes)) if c.workspace_bytes is None else np.asarray(c.workspace_bytes, dtype=float)
    np.testing.assert_allclose(z3.workspace_bytes, own + c.param_bytes)
    z3t = tensor_parallel_costs(c, blocks, 4, INTRA, dp=8, zero=3, dp_link=INTER)
    np.testing.assert_allclose(z3t.workspace_bytes, own + np.where(blocks, c.param_bytes / 4, c.param_bytes))
    assert tensor_parallel_costs(c, blocks, 1, INTRA, dp=1, zero=3, dp_link=INTER).workspace_bytes is c.workspace_bytes
    z1 = tensor_parallel_costs(c, blocks, 1, INTRA, dp=8, zero=1, dp_link=INTER)
    # ZeRO-1 steps 1/D of the state, then broadcasts the updated weights (as an all-gather)
    np.testing.assert_allclose(z1.optimizer_ms, c.optimizer_ms / 8 + allgather_ms(c.param_bytes, 8, INTER))
    slow = tensor_parallel_costs(c, blocks, 4, INTRA, compute_scale=2.0)
    assert slow.fwd_ms[1] == pytest.approx(2 * c.fwd_ms[1] / 4 + comm)
    assert slow.fwd_ms[0] == pytest.approx(2 * c.fwd_ms[0])
    # a compute calibration is about time: bytes are the same as without it
    np.testing.assert_allclose(slow.param_bytes, t4.param_bytes)
    np.testing.assert_allclose(slow.activation_bytes, t4.activation_bytes)


def test_parallel_config_round_trip_and_validation():
    cfg = ParallelConfig(dp=8, pp=12, tp=4, zero=1)
    assert cfg.gpus == 384
    assert ParallelConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.to_dict() == {"dp": 8, "pp": 12, "tp": 4, "zero": 1}
    assert parse_parallel("tp=4, pp=12,dp=8", zero=1) == cfg
    assert parse_parallel("dp=8,pp=12,tp=4,zero=1") == cfg
    for bad in ({"dp": 0}, {"tp": 1.5}, {"zero": 4}, {"pp": True}):
        with pytest.raises(PplanError):
            ParallelConfig(**bad)
    with pytest.raises(PplanError, match="unknown"):
        ParallelConfig.from_dict({"dp": 1, "ep": 2})
    with pytest.raises(PplanError):
        parse_parallel("dp=two")
    with pytest.raises(PplanError):
        parse_parallel("dp8")
    assert math.isclose(ParallelConfig().gpus, 1)


def test_pipeline_links_are_the_slowest_over_every_replica():
    # each boundary is inter-node when any replica's two stages sit on two nodes, with rank = t + T(p + P d)
    for gpn in (1, 2, 4, 8, 16):
        for tp in (t for t in (1, 2, 4, 8) if gpn % t == 0):
            for dp in range(1, 11):
                for pp in range(1, 11):
                    node = lambda p, d: (tp * (p + pp * d)) // gpn  # noqa: E731
                    want = tuple(INTER if any(node(s, d) != node(s + 1, d) for d in range(dp)) else INTRA
                                 for s in range(pp - 1))
                    assert placement(dp, pp, tp, gpn, INTRA, INTER).pp == want, (gpn, tp, dp, pp)


def test_gpt_model_flops_for_any_mlp_width():
    B, s, l, h, V = 8, 1024, 12, 768, 50304
    for f in (1, 2, 4, 8):
        plain = gpt_model_flops(B, s, l, h, V, recompute=False, ffn=f)
        assert plain == pytest.approx(B * s * (l * (6 * (4 + 2 * f) * h * h + 12 * s * h) + 6 * h * V), rel=1e-12)
        rec = gpt_model_flops(B, s, l, h, V, recompute=True, ffn=f)
        assert rec == pytest.approx(B * s * (l * (8 * (4 + 2 * f) * h * h + 16 * s * h) + 6 * h * V), rel=1e-12)
    # f = 4 is the published equation exactly, and the default
    assert gpt_model_flops(B, s, l, h, V, False, ffn=4) == pytest.approx(72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h)), rel=1e-12)
    assert gpt_model_flops(B, s, l, h, V, True, ffn=4) == pytest.approx(96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h)), rel=1e-12)
    assert gpt_model_flops(B, s, l, h, V, False) == gpt_model_flops(B, s, l, h, V, False, ffn=4)


def test_model_flops_follow_the_profiles_mlp_width():
    # the analytic profile counts each layer's forward FLOPs from its own matmuls: model FLOPs are 3 x those
    for f in (1, 2, 4, 8):
        prof = analytic_profile(f"gpt:layers=4,hidden=512,heads=8,seq=256,vocab=4096,ffn={f}", "a100-80gb", "bfloat16", [1])
        forward = float(np.sum(prof.columns["flops"][:, 0])) * 16
        assert model_flops(prof, 16).plain == pytest.approx(3 * forward, rel=1e-9), f
