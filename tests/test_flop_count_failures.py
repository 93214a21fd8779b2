"""A layer whose FLOPs torch's counter cannot count is named, not silently counted as 0.

The realistic trigger: torch releases before pytorch/pytorch#177169 assert in sdpa_flop_count that
query, key and value have as many heads, so every grouped-query attention layer fails to count;
the tests put that older formula back by monkeypatching.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import torch.utils.flop_counter as flop_counter

from planner.cost.model_flops import UNCOUNTED_FLOPS_KEY, model_flops, uncounted_flops_layers, uncounted_flops_warning
from planner.profiling.flops import count_failures, count_forward_flops, uncounted_meta
from planner.profiling.metadata import META_KEYS
from planner.profiling.csvio import profile_to_text
from planner.profiling.profile import make_profile, read_profile_text



def _old_sdpa_flop_count(query_shape, key_shape, value_shape):
    """torch's formula before pytorch/pytorch#177169: equal heads asserted (GQA fails)."""
    b, h, s_q, d_q = query_shape
    _b2, _h2, s_k, _d2 = key_shape
    _b3, _h3, _s3, d_v = value_shape
    assert b == _b2 == _b3 and h == _h2 == _h3 and d_q == _d2 and s_k == _s3 and d_q == d_v
    return 4 * b * h * s_q * s_k * d_q


def _gqa_forward() -> torch.Tensor:
    q, kv = torch.randn(1, 4, 8, 8), torch.randn(1, 2, 8, 8)  # 4 query heads share 2 key/value heads
    return F.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)


def test_a_failed_count_is_recorded_with_its_reason(monkeypatch):
    monkeypatch.setattr(flop_counter, "sdpa_flop_count", _old_sdpa_flop_count)
    with count_failures() as failures:
        assert count_forward_flops(_gqa_forward) == 0
    assert len(failures) == 1 and failures[0].startswith("AssertionError")
    assert count_forward_flops(_gqa_forward) == 0  # outside count_failures nothing is recorded, nothing fails
    with count_failures() as failures:
        assert count_forward_flops(lambda: torch.ones(2, 3) @ torch.ones(3, 4)) == 2 * 2 * 3 * 4
    assert failures == []


def test_uncounted_meta_names_the_rows_and_zeroes_them():
    flops = np.array([[10.0, 20.0], [np.nan, 5.0], [3.0, 4.0], [np.nan, np.nan]])
    assert uncounted_meta(flops) == {UNCOUNTED_FLOPS_KEY: "1,3"}
    assert not np.isnan(flops).any() and flops[1, 0] == 0.0
    assert uncounted_meta(np.ones((2, 1))) == {}


def _flops_profile(meta: dict[str, str]):
    cols = {"fwd_ms": np.ones((3, 1)), "bwd_ms": np.ones((3, 1)), "flops": np.array([[100.0], [0.0], [200.0]])}
    return make_profile(["embed", "attn", "head"], [1], cols, meta)


def test_mfu_says_it_leaves_the_uncounted_layers_out():
    flops = model_flops(_flops_profile({UNCOUNTED_FLOPS_KEY: "1"}), global_batch=2)
    assert flops.plain == 3.0 * 300 * 2
    assert flops.uncounted == ("layer 1 (attn)",)
    assert "leaving out layer 1 (attn)" in flops.source and "flop counter failed" in flops.source
    assert "MFU and TFLOP/s leave out" in flops.warning and "layer 1 (attn)" in flops.warning


def test_the_key_survives_the_profile_file():
    profile = _flops_profile({UNCOUNTED_FLOPS_KEY: "1"})
    again = read_profile_text(profile_to_text(profile))
    assert uncounted_flops_layers(again) == ("layer 1 (attn)",)
    assert "layer 1 (attn)" in uncounted_flops_warning(again)


def test_a_fully_counted_profile_says_nothing():
    flops = model_flops(_flops_profile({}), global_batch=2)
    assert flops.uncounted == () and flops.warning is None
    assert flops.source == "profile flops column: 3 x forward (+1 x forward recomputed)"
    assert uncounted_flops_warning(_flops_profile({})) is None


def test_profiling_names_the_layers_the_counter_failed_on(monkeypatch):
    from planner.profiling.profiler import profile_model

    monkeypatch.setattr(flop_counter, "sdpa_flop_count", lambda *shapes: 1 / 0)  # every attention count fails
    profile = profile_model("gpt:layers=2,hidden=16,heads=2,seq=8,vocab=32", [1, 2], warmup=0, repeats=1, timer="wall")
    assert profile.names == ("embed", "block0", "block1", "norm_head")
    assert profile.meta[UNCOUNTED_FLOPS_KEY] == "1,2"  # the blocks; the embedding counts 0 FLOPs without failing
    assert list(profile.columns["flops"][:, 0] > 0) == [False, False, False, True]
    assert "MFU and TFLOP/s count a gpt's FLOPs by formula" in uncounted_flops_warning(profile)


def test_the_metadata_key_is_known_and_checked():
    """A profile naming uncounted layers loads; a malformed list is refused as any bad metadata is."""
    from planner.errors import ProfileError

    assert META_KEYS[UNCOUNTED_FLOPS_KEY]("1,4") is None and META_KEYS[UNCOUNTED_FLOPS_KEY]("") is None
    for bad in ("1_0", "-1", "a", "1,,2"):
        assert META_KEYS[UNCOUNTED_FLOPS_KEY](bad) is not None, bad
    text = "# flops_uncounted: 1_0\nname,micro_batch_size,fwd_ms,bwd_ms,param_bytes,activation_bytes,output_bytes\nl,1,1,1,0,0,0\n"
    with pytest.raises(ProfileError, match="flops_uncounted"):
        read_profile_text(text, "p.csv")


def test_partition_and_simulate_of_a_cluster_plan_say_what_their_mfu_leaves_out(pplan, tmp_path):
    from pathlib import Path

    profile = tmp_path / "mlp.csv"
    profile.write_text("# flops_uncounted: 1,3\n" + (Path(__file__).parents[1] / "profiles" / "mlp.csv").read_text())
    code, _, err = pplan("partition", profile, "--nodes", 1, "--gpus-per-node", 2, "--hardware", "a100-80gb",
                         "--global-batch", 32, "-o", tmp_path / "p.json")
    assert code == 0, err
    said = "MFU and TFLOP/s leave out the FLOPs of layer 1 (fc1), layer 3 (fc3)"
    assert said in err
    code, _, err = pplan("simulate", tmp_path / "p.json")
    assert code == 0 and said in err, err
