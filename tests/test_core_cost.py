import numpy as np
import pytest

from planner.cost import stage_cost, stage_memory
from planner.errors import PplanError
from planner.profiling.profile import make_profile


def _profile():
    n = 4
    cols = {
        "fwd_ms": np.array([[1.0], [2.0], [3.0], [4.0]]),
        "bwd_ms": np.array([[2.0], [4.0], [6.0], [8.0]]),
        "param_bytes": np.array([[100.0], [200.0], [300.0], [400.0]]),
        "activation_bytes": np.array([[1000.0], [2000.0], [3000.0], [4000.0]]),
        "output_bytes": np.array([[10.0], [20.0], [30.0], [40.0]]),
    }
    return make_profile([f"l{i}" for i in range(n)], [1], cols, {"input_bytes_per_sample": "5"})


def test_stage_cost_without_recompute():
    c = stage_cost(_profile().at(1), 1, 3, optimizer="adam")
    assert (c.fwd_ms, c.bwd_ms) == (5.0, 10.0)
    assert c.bwd_input_ms + c.bwd_weight_ms == pytest.approx(c.bwd_ms)
    assert c.param_bytes == 500 and c.static_bytes == 500 * 4  # weights, grads, two Adam moments
    assert c.kept_bytes == 5000 and c.transient_bytes == 0
    assert (c.input_bytes, c.output_bytes) == (10.0, 30.0)


def test_recompute_trades_forward_time_for_memory():
    costs = _profile().at(1)
    c = stage_cost(costs, 1, 3, recompute=[2], optimizer="sgd")
    assert c.bwd_ms == 10.0 + 3.0 and c.recompute_ms == 3.0
    assert c.kept_bytes == 2000 + 20  # layer 2 keeps only its input (layer 1's output)
    assert c.transient_bytes == 3000
    assert c.static_bytes == 500 * 3
    first = stage_cost(costs, 0, 2, recompute=[0])
    assert first.kept_bytes == 5 + 2000 and first.input_bytes == 0


def test_speed_divides_time():
    c = stage_cost(_profile().at(1), 0, 4, speed=2.0)
    assert c.fwd_ms == 5.0 and c.bwd_ms == 10.0


def test_memory_breakdown():
    c = stage_cost(_profile().at(1), 1, 3)
    m = stage_memory([c], peak_activation_bytes=3 * c.kept_bytes)
    assert m.total == 500 + 500 + 1000 + 15000 + 2 * (10 + 30)


def test_bad_ranges():
    costs = _profile().at(1)
    with pytest.raises(PplanError):
        stage_cost(costs, 2, 2)
    with pytest.raises(PplanError):
        stage_cost(costs, 0, 2, recompute=[3])
    with pytest.raises(PplanError):
        stage_cost(costs, 0, 2, optimizer="lion")


@pytest.mark.parametrize("optimizer, master_state", [("adam", 12), ("adamw", 12), ("sgd", 8), ("sgd-plain", 4)])
def test_a_16bit_profile_prices_fp32_masters_and_state(optimizer, master_state):
    # 500 param bytes in bfloat16 are 250 parameters: 2 B weights + 2 B gradients each, and the
    # optimizer's fp32 master copy with fp32 buffers (planner.master_weights), as pplan run trains them
    from planner.cost.arrays import layer_arrays

    prof = _profile()
    bf16 = make_profile(prof.names, [1], {k: v for k, v in prof.columns.items() if k in (
        "fwd_ms", "bwd_ms", "param_bytes", "activation_bytes", "output_bytes")},
                        {"input_bytes_per_sample": "5", "dtype": "bfloat16"})
    c = stage_cost(bf16.at(1), 1, 3, optimizer=optimizer)
    assert c.static_bytes == 500 + 500 + 250 * master_state
    assert stage_memory([c], 0.0).optimizer == 250 * master_state
    assert float(layer_arrays(bf16.at(1), optimizer).static_bytes[1:3].sum()) == c.static_bytes  # the solvers' arrays
    assert stage_cost(prof.at(1), 1, 3, optimizer=optimizer).static_bytes == 500 * (2 + master_state // 4 - 1)
