"""A user model's last stage: the step's targets it holds, what its loss keeps, and the profile field
that says how large a target is (planner.cost.batch, target_bytes_per_sample, the executor's loss)."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from helpers.pipeline import profile_partition_run
from planner.cost.batch import layer_range_batch_bytes, stage_batch_bytes
from planner.errors import ProfileError
from planner.profiling.profile import make_profile, read_profile_text
from planner.profiling.saved import checkpoint_extra_bytes

# A tiny language model that returns logits, trained (no make_batch) on regression targets of the
# logits' shape: its target is far larger than its input, as the reviewer's lm_untied's was.
LM_FACTORY = textwrap.dedent("""
    from collections import OrderedDict
    from torch import nn

    def build(vocab=200, d=16, seq=8):
        return nn.Sequential(OrderedDict(tok=nn.Embedding(vocab, d), mix=nn.Linear(d, d), head=nn.Linear(d, vocab)))
""")
LM_FLAGS = ("--input-shape", "8", "--input-dtype", "long", "--vocab", "200")


def _profile(meta: dict[str, str]):
    cols = {c: np.full((3, 1), v, dtype=float) for c, v in
            (("fwd_ms", 1.0), ("bwd_ms", 2.0), ("param_bytes", 100.0), ("activation_bytes", 10.0), ("output_bytes", 4.0))}
    return make_profile(["a", "b", "c"], [4], cols, meta)


def test_a_stage_holds_the_inputs_where_it_is_first_and_the_targets_where_it_is_last():
    assert stage_batch_bytes(10.0, 3.0, True, False) == 10.0
    assert stage_batch_bytes(10.0, 3.0, False, True) == 3.0
    assert stage_batch_bytes(10.0, 3.0, True, True) == 13.0  # one stage: both
    assert stage_batch_bytes(10.0, 3.0, False, False) == 0.0
    first, last = np.array([[True], [False], [False]]), np.array([[False, True]])  # the DP's (first, end) grid
    assert stage_batch_bytes(10.0, 3.0, first, last).tolist() == [[10.0, 13.0], [0.0, 3.0], [0.0, 3.0]]


def test_the_profile_records_the_target_per_sample_and_costs_scale_it_by_the_micro_batch():
    costs = _profile({"input_bytes_per_sample": "5", "target_bytes_per_sample": "7"}).at(4)
    assert costs.target_bytes == 28.0 and costs.input_bytes == 20.0
    assert [layer_range_batch_bytes(costs, f, e) for f, e in ((0, 1), (1, 2), (2, 3), (0, 3))] == [20.0, 0.0, 28.0, 48.0]


def test_a_profile_without_the_target_field_reads_as_before():
    prof = _profile({"input_bytes_per_sample": "5"})
    assert prof.target_bytes_per_sample == 0.0 and prof.at(4).target_bytes == 0.0
    assert layer_range_batch_bytes(prof.at(4), 2, 3) == 0.0


@pytest.mark.parametrize("value, words", [("-1", ">= 0"), ("lots", "not a number"), ("inf", "finite")])
def test_a_bad_target_field_names_the_key_and_the_value(value, words):
    body = "layer,name,micro_batch_size,fwd_ms,bwd_ms,param_bytes,activation_bytes,output_bytes\n0,a,1,1,2,100,10,4\n"
    with pytest.raises(ProfileError) as e:
        read_profile_text(f"# target_bytes_per_sample: {value}\n" + body)
    assert "'target_bytes_per_sample'" in e.value.message and repr(value) in e.value.message and words in e.value.message


def test_the_checkpointed_last_layer_does_not_count_the_target_its_loss_saves():
    out, target = torch.randn(4, 50), torch.randn(4, 50)
    extra = checkpoint_extra_bytes(out, F.mse_loss, target)
    # the RNG state and the output the loss saves; the target is the step's batch (planner.cost.batch)
    assert extra == torch.get_rng_state().nbytes + out.numel() * out.element_size()


def test_the_executor_loss_owns_only_its_own_bytes():
    from planner.profiling.stageloss import compact_loss

    out = torch.randn(8, 16, 50, requires_grad=True)
    target = torch.randn(8, 16, 50)
    plain = F.mse_loss(out, target)  # a 0-d view of the unreduced (8, 16, 50) tensor
    loss = compact_loss(F.mse_loss)(out, target)
    assert plain.untyped_storage().nbytes() > plain.nbytes
    assert loss.untyped_storage().nbytes() == loss.nbytes and loss.item() == plain.item()
    loss.backward()
    want = torch.autograd.grad(F.mse_loss(out, target), out)[0]
    assert torch.equal(out.grad, want)


def test_profiling_a_factory_model_records_its_target_and_leaves_it_out_of_the_activations(tmp_path, monkeypatch):
    from planner.profiling.profiler import profile_model

    (tmp_path / "byo_lm.py").write_text(LM_FACTORY)
    monkeypatch.chdir(tmp_path)
    prof = profile_model("byo_lm:build", [2], warmup=0, repeats=1, input_shape=(8,), input_dtype="long", vocab=200)
    assert prof.target_bytes_per_sample == 8 * 200 * 4  # (seq, vocab) float32 regression targets
    head = prof.at(2)
    # the head saves its input, the loss the logits (and the target, which the last stage holds anyway)
    assert head.activation_bytes[-1] == head.input_saved_bytes[-1] + head.output_bytes[-1]


@pytest.mark.slow
def test_the_last_rank_holds_the_steps_targets_and_no_loss_sized_tensors(tmp_path):
    """Two ranks, 1f1b: the last rank's measured buffers are its receive buffers and the step's whole
    target batch, and what it measured beyond its buffers is what the cost model predicts beyond its
    buffers (the losses of F.mse_loss once held an output each: 2.2x the prediction here)."""
    (tmp_path / "byo_lm.py").write_text(LM_FACTORY)
    run = profile_partition_run(tmp_path, "byo_lm:build", memory="64MiB", profile_flags=LM_FLAGS)
    last = max(run["ranks"], key=lambda r: r["stages"])
    received = run["boundary_bytes"][str(last["stages"][0])][0]
    assert last["memory_measured"]["buffers"] == 8 * received + 64 * 8 * 200 * 4
    beyond_measured = last["peak_memory_bytes_measured"] - last["memory_measured"]["buffers"]
    beyond_predicted = last["peak_memory_bytes_predicted"] - last["memory_predicted"]["buffers"]
    assert beyond_measured == pytest.approx(beyond_predicted, rel=0.10), (last["memory_measured"], last["memory_predicted"])
