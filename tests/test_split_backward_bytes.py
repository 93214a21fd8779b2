"""What a running zero-bubble W holds, per layer: profile columns w_workspace_bytes and w_carry_bytes.

torch's stage_backward_weight makes the weight gradients one parameter group at a time (a Linear's
weight and bias are one group), adds them into the existing .grad and keeps the previous group's
fresh gradients while it makes the next (planner.profiling.split_backward).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from planner.errors import ProfileError
from planner.profiling.analytic import analytic_profile
from planner.profiling.measure import measure_layer
from planner.profiling.profile import load_profile, make_profile, read_profile_text, write_profile
from planner.profiling.split_backward import split_backward_bytes


def _linear_bytes(n_in: int, n_out: int) -> int:
    """Gradient bytes of one float32 Linear's group: its weight and its bias."""
    return (n_in * n_out + n_out) * 4


def _measure(layer: torch.nn.Module, needs_grad: bool = True):
    torch.manual_seed(0)
    m, _, _ = measure_layer(layer, torch.randn(8, 64, requires_grad=needs_grad), warmup=0, repeats=1)
    return m.w_workspace_bytes, m.w_carry_bytes


def test_one_linear_holds_its_own_fresh_gradients():
    # one group (weight and bias meet the input's path at the same addmm): W allocates dW and db,
    # float32 GEMMs allocate nothing through torch's allocator
    assert _measure(torch.nn.Linear(64, 64)) == (_linear_bytes(64, 64), _linear_bytes(64, 64))  # 16,640 each


def test_a_chain_of_linears_holds_two_consecutive_groups_and_carries_the_last():
    two = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32))
    assert _measure(two) == (_linear_bytes(64, 64) + _linear_bytes(64, 32), _linear_bytes(64, 32))
    # three groups: never all three at once, the largest adjacent pair (the first two here)
    three = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 64))
    assert _measure(three) == (_linear_bytes(64, 64) + _linear_bytes(64, 16), _linear_bytes(16, 64))


def test_no_parameters_or_no_input_gradient_hold_nothing():
    assert _measure(torch.nn.ReLU()) == (0, 0)
    assert _measure(torch.nn.Linear(64, 64), needs_grad=False) == (0, 0)  # a first layer: torch's W is its whole backward


def test_gradients_are_left_as_they_were():
    layer = torch.nn.Linear(64, 32)
    x = torch.randn(4, 64, requires_grad=True)
    y = layer(x)
    got = split_backward_bytes([y], [torch.ones_like(y)], [x], list(layer.parameters()), torch.device("cpu"))
    assert (got.wgrad_bytes, got.w_workspace_bytes, got.w_carry_bytes) == (4 * 32 * 4, _linear_bytes(64, 32), _linear_bytes(64, 32))
    assert x.grad is None and layer.weight.grad is None and layer.bias.grad is None


def _profile(extra: dict[str, list[float]] | None = None):
    cols = {"fwd_ms": np.ones((2, 2)), "bwd_ms": np.full((2, 2), 2.0), "param_bytes": np.full((2, 2), 100.0),
            "activation_bytes": np.full((2, 2), 1000.0), "output_bytes": np.full((2, 2), 10.0)}
    cols.update({name: np.array(values, dtype=float) for name, values in (extra or {}).items()})
    return make_profile(["a", "b"], [2, 4], cols)


def test_the_columns_round_trip_and_the_carry_does_not_scale(tmp_path):
    prof = _profile({"w_workspace_bytes": [[0, 0], [300, 500]], "w_carry_bytes": [[0, 0], [200, 200]]})
    write_profile(prof, tmp_path / "p.csv")
    loaded = load_profile(tmp_path / "p.csv")
    assert {"w_workspace_bytes", "w_carry_bytes"} <= loaded.present
    costs = loaded.at(4)
    assert list(costs.w_workspace_bytes) == [0.0, 500.0] and list(costs.w_carry_bytes) == [0.0, 200.0]
    assert list(loaded.at(3).w_workspace_bytes) == [0.0, 400.0]  # interpolated like every per-micro-batch column
    assert list(loaded.at(8).w_carry_bytes) == [0.0, 200.0]  # parameter gradients: the same at any size


def test_a_profile_without_them_has_none_and_a_misspelt_one_is_refused():
    costs = _profile().at(2)
    assert costs.w_workspace_bytes is None and costs.w_carry_bytes is None
    text = "layer,name,micro_batch_size,fwd_ms,bwd_ms,param_bytes,activation_bytes,output_bytes,w_carry_byte\n0,a,1,1,2,0,0,0,0\n"
    with pytest.raises(ProfileError, match="did you mean 'w_carry_bytes'"):
        read_profile_text(text)


# FFN width 2: QKV + proj is the block's largest pair; 3: FC1 + FC2. A vocabulary that is not a multiple of hidden.
@pytest.mark.parametrize("spec", ["gpt:layers=1,hidden=32,heads=2,seq=8,vocab=50,ffn=2",
                                  "gpt:layers=2,hidden=48,heads=3,seq=8,vocab=70,ffn=3"])
def test_analytic_gpt_equals_a_live_float32_profile(spec):
    from planner.profiling.profiler import profile_model

    measured = profile_model(spec, [1, 3], warmup=0, repeats=1, timer="wall")
    prof = analytic_profile(spec, "cpu", "float32", [1, 3])
    for column in ("w_workspace_bytes", "w_carry_bytes"):
        assert column in measured.present and column in prof.present
        assert np.array_equal(prof.columns[column], measured.columns[column]), (column, prof.columns[column], measured.columns[column])
    assert prof.columns["w_workspace_bytes"][0].tolist() == [0, 0]  # the embedding: a first layer


def test_analytic_gpt_in_bfloat16_carries_exactly_and_leaves_out_the_cpu_gemm_scratch():
    from planner.profiling.profiler import profile_model

    spec = "gpt:layers=1,hidden=32,heads=2,seq=8,vocab=50,ffn=3"
    measured = profile_model(spec, [2], dtype="bfloat16", warmup=0, repeats=1, timer="wall")
    prof = analytic_profile(spec, "cpu", "bfloat16", [2])
    assert np.array_equal(prof.columns["w_carry_bytes"], measured.columns["w_carry_bytes"])
    # oneDNN's 16-bit GEMMs allocate scratch on a CPU (docs/hardware.md): the measurement holds more
    assert np.all(prof.columns["w_workspace_bytes"] <= measured.columns["w_workspace_bytes"])
    h, f = 32, 3
    assert prof.columns["w_workspace_bytes"][1, 0] == (2 * f * h * h + (f + 1) * h) * 2  # FC1 + FC2
