"""Bounds on the hardware and cluster-search paths: unit mistakes in a hardware file, GPU counts
the search cannot enumerate, an MFU above 100%, non-finite predictions, a profile made for other
hardware. Each is one line naming the value, exit code 2 and no file."""

import json
import math
from dataclasses import replace

import pytest

import planner.partition.parallel_search as parallel_search
from planner.cost.parallel import checked_mfu
from planner.errors import ClusterError, PlanError, PplanError
from planner.hardware import PRESETS, hardware_from_dict
from planner.partition.parallel_checks import MAX_GPUS
from planner.partition.parallel_plan import parallel_plan
from planner.partition.parallel_search import plan_parallel
from planner.plan import plan_to_json, write_plan
from planner.profiling.analytic import analytic_profile, write_analytic_profile

SMALL = "gpt:layers=4,hidden=256,heads=4,seq=128,vocab=1000"


@pytest.fixture(scope="module")
def h200_profile():
    return analytic_profile(SMALL, "h200", "bfloat16", [1, 2, 4])


@pytest.mark.parametrize("key, value, words", [
    ("peak_bf16_flops_per_s", 989, "989 FLOP/s is below 1e\\+09 FLOP/s.*9.89e14 for 989 TFLOP/s"),  # TFLOP/s written as FLOP/s
    ("peak_bf16_flops_per_s", 1e-300, "below 1e\\+09 FLOP/s"),
    ("peak_fp32_flops_per_s", 67, "below 1e\\+09 FLOP/s"),
    ("memory_bytes", 80, "80 bytes is below .*'80GiB'"),  # GB written as bytes
    ("memory_bandwidth_bytes_per_s", 4.8, "below 1e\\+06 bytes/s.*'3.35TB/s'"),  # TB/s written as bytes/s
    ("inter_node_bandwidth_bytes_per_s", 400, "below 1e\\+06 bytes/s"),
    ("intra_node_latency_ms", 5000, "5000 ms is beyond any real device.*milliseconds"),
])
def test_unit_mistakes_in_a_hardware_file_are_refused_with_the_unit_to_write(key, value, words):
    data = {**PRESETS["h200"].to_dict(), key: value}
    with pytest.raises(ClusterError, match=words) as info:
        hardware_from_dict(data, "my.json")
    assert f"my.json: {key}" in str(info.value) and "\n" not in str(info.value)


def test_the_ranges_hold_every_preset_and_their_edges():
    for hw in PRESETS.values():
        assert hardware_from_dict(json.loads(json.dumps(hw.to_dict()))) == hw
    edges = {"peak_bf16_flops_per_s": 1e9, "memory_bytes": 2**26, "memory_bandwidth_bytes_per_s": 1e6,
             "intra_node_latency_ms": 1000, "inter_node_latency_ms": 0}
    hw = hardware_from_dict({**PRESETS["h200"].to_dict(), **edges})
    assert (hw.peak_bf16_flops_per_s, hw.memory_bytes, hw.intra_node_latency_ms) == (1e9, 2**26, 1000)


def test_cli_refuses_a_tiny_peak_before_writing_anything(pplan, tmp_path):
    profile = tmp_path / "ga.csv"
    write_analytic_profile(SMALL, "h200", "bfloat16", [1, 2, 4], profile)
    hw = tmp_path / "h_989.json"
    hw.write_text(json.dumps({**PRESETS["h200"].to_dict(), "peak_bf16_flops_per_s": 989}))
    out = tmp_path / "n.json"
    code, stdout, err = pplan("partition", profile, "--global-batch", 64, "--out", out, "--nodes", 1, "--hardware", hw)
    assert code == 2 and stdout == "" and not out.exists()
    assert err.count("\n") == 1 and "Traceback" not in err and "peak_bf16_flops_per_s 989 FLOP/s" in err
    analytic = tmp_path / "p.csv"
    code, _, err = pplan("profile", "--analytic", "--model", SMALL, "--hardware", hw, "-o", analytic)
    assert code == 2 and not analytic.exists() and "h_989.json: peak_bf16_flops_per_s" in err


def test_an_mfu_above_100_percent_is_refused_naming_the_peak_and_the_achieved_flops(h200_profile):
    assert checked_mfu(0.42, 1e12, "x") == 0.42
    with pytest.raises(PplanError, match=r"MFU 150% is above 100%: 1.5e\+12 FLOP/s .* 1e\+12 FLOP/s peak of x"):
        checked_mfu(1.5, 1e12, "x")
    with pytest.raises(PplanError, match="above 100%"):
        checked_mfu(math.inf, 1e12, "x")
    # H200 times against the cpu preset's 96 GFLOP/s: each "GPU" would run 100x beyond its peak
    with pytest.raises(PplanError, match=r"MFU .* is above 100%.*9.6e\+10 FLOP/s peak of cpu"):
        plan_parallel(h200_profile, hardware="cpu", nodes=1, global_batch=64)


def test_a_plan_with_a_non_finite_number_names_the_field_and_is_not_written(h200_profile, tmp_path):
    result = plan_parallel(h200_profile, hardware="h200", nodes=1, global_batch=64)
    plan = parallel_plan(result, h200_profile, PRESETS["h200"])
    plan_to_json(plan)  # the real plan serializes
    broken = replace(plan, predicted=replace(plan.predicted, mfu=math.inf))
    with pytest.raises(PlanError, match="plan field predicted.mfu is inf, not a finite number"):
        plan_to_json(broken)
    out = tmp_path / "n.json"
    with pytest.raises(PlanError, match="not writing plan"):
        write_plan(broken, out)
    assert not out.exists()


@pytest.mark.parametrize("nodes", [10**20, 10**6, MAX_GPUS // 8 + 1])
def test_too_many_gpus_are_refused_naming_the_options_before_layouts_are_enumerated(h200_profile, monkeypatch, nodes):
    def enumerated(*args):
        raise AssertionError("layouts enumerated before the GPU count was checked")

    monkeypatch.setattr(parallel_search, "candidate_layouts", enumerated)
    monkeypatch.setattr(parallel_search, "divisors", enumerated)
    with pytest.raises(PplanError, match=rf"--nodes {nodes} x --gpus-per-node 8 = {nodes * 8} GPUs .*\({MAX_GPUS}\)") as info:
        plan_parallel(h200_profile, hardware="h200", nodes=nodes, global_batch=64)
    assert f"at most {MAX_GPUS // 8} nodes of 8" in str(info.value)


@pytest.mark.parametrize("gpus_per_node, words", [(0, "--gpus-per-node must be .* at least 1, got 0"),
                                                  (-2, "--gpus-per-node must be .* at least 1, got -2"),
                                                  (5000, "--gpus-per-node 5000 is more than any node holds")])
def test_gpus_per_node_zero_is_refused_not_taken_as_the_presets(h200_profile, gpus_per_node, words):
    with pytest.raises(PplanError, match=words):
        plan_parallel(h200_profile, hardware="h200", nodes=1, gpus_per_node=gpus_per_node, global_batch=64)


def test_a_global_batch_no_layout_splits_is_named_rather_than_memory(h200_profile):
    # SMALL has 4 heads: tp is at most 4 (planner.partition.parallel_runnable), pp at most 4 of its 6 layers
    with pytest.raises(PplanError, match="--global-batch 64 does not split .* 1048576 GPUs .*least dp is 65536") as info:
        plan_parallel(h200_profile, hardware="h200", nodes=MAX_GPUS // 8, global_batch=64)
    assert "no plan fits" not in str(info.value)


def test_a_profile_made_for_other_hardware_plans_with_one_warning_line(h200_profile):
    same = plan_parallel(h200_profile, hardware="h200", nodes=1, global_batch=64)
    assert same.warnings == ()
    other = plan_parallel(h200_profile, hardware="h100-80gb", nodes=1, global_batch=64)
    assert len(other.warnings) == 1 and "\n" not in other.warnings[0]
    assert "'h200'" in other.warnings[0] and "'h100-80gb'" in other.warnings[0] and "--hardware h100-80gb" in other.warnings[0]
    assert other.best.iteration_ms == same.best.iteration_ms  # the times stay the profile's
