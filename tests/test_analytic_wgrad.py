"""Analytic wgrad_bytes: what zero-bubble's I keeps for W, equal to what `pplan profile` measures on the gpt."""

import numpy as np
import pytest

from planner.cost.held import wgrad_unmeasured_note
from planner.profiling.analytic import analytic_profile

# The brief's model (hidden 256, seq 256, vocab 1024, ffn 4) and a narrower one whose FFN width (3)
# and vocabulary (100, not a multiple of hidden) would expose a wrong coefficient in either formula.
CASES = [
    ("gpt:layers=2,hidden=256,heads=4,seq=256,vocab=1024", "float32"),
    ("gpt:layers=2,hidden=96,heads=3,seq=40,vocab=100,ffn=3", "bfloat16"),
]


@pytest.mark.parametrize("spec, dtype", CASES)
def test_wgrad_bytes_equal_a_live_measured_profile_layer_by_layer(spec, dtype):
    pytest.importorskip("torch")
    from planner.profiling.profiler import profile_model

    sizes = [1, 3]
    measured = profile_model(spec, sizes, dtype=dtype, warmup=0, repeats=1, timer="wall")
    prof = analytic_profile(spec, "cpu", dtype, sizes)
    assert prof.names == measured.names
    assert "wgrad_bytes" in prof.present and "wgrad_bytes" in measured.present
    got, want = prof.columns["wgrad_bytes"], measured.columns["wgrad_bytes"]
    assert np.array_equal(got, want), (got, want)
    assert np.all(got[1:] > 0)  # every layer with an input gradient holds something for its W


def test_wgrad_formula_per_layer_and_dtype():
    b, s, h, a, V, f = 2, 64, 128, 4, 500, 3
    spec = f"gpt:layers=3,hidden={h},heads={a},seq={s},vocab={V},ffn={f}"
    for dtype, size in (("float32", 4), ("bfloat16", 2), ("float16", 2)):
        prof = analytic_profile(spec, "h100-80gb", dtype, [b])
        col = prof.columns["wgrad_bytes"][:, 0]
        assert col[0] == 0  # the embedding's input (token ids) has no gradient
        assert np.all(col[1:4] == (7 + f) * b * s * h * size)  # ln1, qkv (3h), proj, ln2, fc1 (f*h), fc2
        assert col[4] == (h + V) * b * s * size  # the final norm's output gradient and the logits'
        assert np.array_equal(col[1:4], (7 + f) * prof.columns["output_bytes"][1:4, 0])


def test_gpt3_175b_block_holds_eleven_outputs_per_micro_batch():
    spec = "gpt:layers=2,hidden=12288,heads=96,seq=2048,vocab=51200"
    prof = analytic_profile(spec, "a100-80gb", "bfloat16", [1, 2])
    block = prof.columns["wgrad_bytes"][1]
    assert block.tolist() == [11 * 2048 * 12288 * 2, 2 * 11 * 2048 * 12288 * 2]  # 554 MB at b = 1
    assert np.array_equal(block, 11 * prof.columns["output_bytes"][1])


def test_zero_bubble_plans_of_analytic_profiles_are_fully_priced():
    prof = analytic_profile("gpt:layers=2,hidden=64,heads=2,seq=16,vocab=64", "a100-80gb", "bfloat16", [1])
    assert wgrad_unmeasured_note(prof.at(1), True) is None


def test_a_zero_bubble_cluster_plan_from_an_analytic_profile_carries_no_unpriced_note(pplan, analytic_profile, tmp_path):
    from planner.plan import load_plan

    path = analytic_profile("gpt:layers=4,hidden=256,heads=4,seq=128,vocab=1000", "1,2")
    out = tmp_path / "plan.json"
    code, _, err = pplan("partition", path, "--nodes", 1, "--gpus-per-node", 2, "--hardware", "a100-80gb",
                         "--global-batch", 64, "--parallel", "dp=1,pp=2,tp=1", "--out", out)
    assert code == 0, err
    assert load_plan(out).schedule == "zb"  # the setting the note was about
    assert "wgrad_bytes" not in err
