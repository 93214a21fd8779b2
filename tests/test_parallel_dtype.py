"""The cluster cost model reads a profile's dtype: parameters from its param_bytes, the training
state per parameter (bf16 mixed precision or pure fp32 Adam), the peak MFU divides by, and
ZeRO's gathered weights, as `pplan partition --nodes` and `pplan simulate` price them."""

from dataclasses import replace

import numpy as np
import pytest

from planner.cost.parallel import model_flops, profile_dtype, profile_precision
from planner.errors import PplanError
from planner.hardware import load_hardware
from planner.partition.parallel_plan import format_parallel, parallel_plan
from planner.partition.parallel_search import plan_parallel
from planner.profiling.analytic import analytic_profile
from planner.simulate import simulate

from helpers.replicas import two_stage_cpu_replica

GPT = "gpt:layers=4,hidden=1024,heads=16,seq=1024,vocab=32000"
# the model `pplan run` measured ZeRO on (docs/parallel.md, "How pplan run executes ZeRO")
SMALL = "gpt:layers=2,hidden=32,heads=2,seq=16,vocab=128,ffn=2"


@pytest.fixture(scope="module")
def both():
    """dtype -> (profile, best candidate of dp=2 on two A100s, no recompute)."""
    out = {}
    for dtype in ("bfloat16", "float32"):
        prof = analytic_profile(GPT, "a100-80gb", dtype, [1, 2])
        best = plan_parallel(prof, hardware="a100-80gb", nodes=1, gpus_per_node=2, global_batch=8,
                             parallel="dp=2,pp=1,tp=1", recompute="none").best
        out[dtype] = (prof, best)
    return out


def _parameters(prof) -> float:
    return float(np.sum(prof.columns["param_bytes"][:, 0])) / profile_precision(prof).element_bytes


def test_a_float32_profile_has_the_same_parameters_and_trains_in_pure_fp32(both):
    (bf_prof, bf), (fp_prof, fp) = both["bfloat16"], both["float32"]
    n = _parameters(bf_prof)
    assert _parameters(fp_prof) == n  # param_bytes are twice as many, the parameters the same
    assert bf.memory.weights == pytest.approx(2 * n) and bf.memory.optimizer == pytest.approx(12 * n)
    assert fp.memory.weights == pytest.approx(4 * n) and fp.memory.optimizer == pytest.approx(8 * n)
    static = {d: both[d][1].memory.weights + both[d][1].memory.optimizer for d in both}
    assert static["float32"] < 1.01 * static["bfloat16"]  # both about 16 bytes per parameter in all


def test_mfu_divides_by_the_peak_of_the_profiles_dtype(both):
    hw = load_hardware("a100-80gb")
    for dtype, (prof, best) in both.items():
        achieved = best.tflops_per_gpu * 1e12  # no recompute: achieved FLOPs are the ones MFU counts
        assert best.mfu == pytest.approx(achieved / hw.peak_flops_per_s(dtype), rel=1e-9)
        result = plan_parallel(prof, hardware=hw, nodes=1, gpus_per_node=2, global_batch=8,
                               parallel="dp=2,pp=1,tp=1", recompute="none", schedules=("1f1b",))
        assert f"{dtype}, MFU against {hw.peak_flops_per_s(dtype) / 1e12:.4g} TFLOP/s peak" in format_parallel(result)


def test_simulate_prices_a_float32_plan_as_the_search_did(both):
    prof, _ = both["float32"]
    hw = load_hardware("a100-80gb")
    result = plan_parallel(prof, hardware=hw, nodes=1, gpus_per_node=2, global_batch=8, parallel="dp=2,pp=1,tp=1",
                           recompute="none", zero=1)
    sim = simulate(parallel_plan(result, prof, hw), prof)
    assert max(sim.peak_memory_bytes) == pytest.approx(result.best.peak_memory_bytes, rel=1e-12)
    assert sim.memory[0].optimizer == pytest.approx(8 * _parameters(prof) / 2)  # ZeRO-1 over 2 replicas
    assert sim.replica.mfu == pytest.approx(result.best.mfu, rel=1e-12)


def test_a_profile_without_a_dtype_is_16_bit_and_an_unknown_one_is_refused(both):
    prof, _ = both["bfloat16"]
    bare = replace(prof, meta={k: v for k, v in prof.meta.items() if k != "dtype"})
    assert profile_dtype(bare) == "bfloat16" and model_flops(bare, 8).dtype == "bfloat16"
    odd = replace(prof, meta={**prof.meta, "dtype": "float64"})
    with pytest.raises(PplanError, match="float64"):
        profile_dtype(odd)
    with pytest.raises(PplanError, match="float64"):
        plan_parallel(odd, hardware="a100-80gb", nodes=1, gpus_per_node=2, global_batch=8, parallel="dp=2")


def _rank0_memory(zero: int):
    """Rank 0's modelled memory in the run docs/parallel.md measured: dp 2 x pp 2, 1f1b, float32."""
    prof = analytic_profile(SMALL, "cpu", "float32", [2])
    sim = two_stage_cpu_replica(SMALL, [0, 2, 4], dp=2, zero=zero)
    return prof.columns["param_bytes"][:2, 0], sim.memory[0]


def test_zero_weights_include_what_fsdp_gathers():
    # measured (docs/parallel.md): zero 2 weights 78,912 = the stage's 52,608 gathered + its
    # 26,304 shard; zero 3 60,480 = the shard + the block being computed (34,176)
    stage, z0 = _rank0_memory(0)
    _, z2 = _rank0_memory(2)
    _, z3 = _rank0_memory(3)
    assert z0.weights == pytest.approx(stage.sum())
    assert z2.weights == pytest.approx(stage.sum() * (1 + 1 / 2))
    assert z3.weights == pytest.approx(stage.sum() / 2)
    assert z3.activations - z0.activations == pytest.approx(stage.max())  # the gathered layer, as its workspace


def test_tensor_parallel_weights_are_what_pplan_run_holds():
    # measured (docs/parallel.md, "How pplan run executes tensor parallelism"): pp 2 x tp 2 holds
    # 35,904 / 34,112 bytes of weights on stages 0 / 1 (tp 1: 52,608 / 50,816); the embedding (18,432)
    # and the final norm + head (16,640) stay whole on each tp rank, the blocks are split
    measured = {1: (52_608, 50_816), 2: (35_904, 34_112)}
    for tp, want in measured.items():
        sim = two_stage_cpu_replica(SMALL, [0, 2, 4], tp=tp)
        for stage in (0, 1):
            got = sim.memory[stage].weights
            # left unmodelled: a block's norms and row-parallel biases (6 x hidden 32 floats) stay whole too
            assert want[stage] - got == (tp - 1) / tp * 6 * 32 * 4, (tp, stage, got)
