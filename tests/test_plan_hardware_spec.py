"""A data/tensor-parallel plan records the values of the hardware it was planned on
(`parallel.hardware_spec`, the keys of a hardware file) and `pplan simulate` prices it on them,
not on the preset that shares the file's name; a plan without them (older) keeps the preset.
`simulate --hardware FILE` takes the file's GPUs per node (refused when tp does not divide them);
without --hardware the plan's own recorded GPUs per node (--gpus-per-node) stay."""

import json

import pytest

from planner.errors import PplanError
from planner.hardware import PRESETS, Hardware
from planner.parallel import ParallelConfig
from planner.plan import load_plan, plan_from_dict, plan_to_json

GPT = "gpt:layers=8,hidden=1024,heads=16,seq=1024,vocab=32000"
LAYOUT = "dp=2,pp=4,tp=2"  # 16 GPUs on 2 nodes of 8: the gradient sync crosses the network


@pytest.fixture
def profile_csv(analytic_profile):
    return analytic_profile(GPT, "1,2")


def _hardware_file(tmp_path, name: str, **values) -> str:
    """A copy of the a100-80gb preset, as `pplan hardware a100-80gb --json` prints it (its name kept), edited."""
    path = tmp_path / name
    path.write_text(json.dumps({**PRESETS["a100-80gb"].to_dict(), **values}))
    return str(path)


def _partition(pplan, profile_csv, out, hardware: str, *extra, nodes: int = 2) -> None:
    code, _, err = pplan("partition", profile_csv, "--nodes", nodes, "--hardware", hardware, "--global-batch", 64,
                         "--parallel", LAYOUT, "--out", out, *extra)
    assert code == 0, err


def _simulate(pplan, plan_path, *extra) -> dict:
    code, stdout, err = pplan("simulate", plan_path, "--json", *extra)
    assert code == 0, err
    return json.loads(stdout)


def test_simulate_prices_a_plan_on_the_hardware_file_it_was_planned_on_not_the_preset_of_its_name(pplan, profile_csv, tmp_path):
    slow = _hardware_file(tmp_path, "slow.json", inter_node_bandwidth_bytes_per_s="50Gbit/s")  # a quarter of the preset's
    out = tmp_path / "plan.json"
    _partition(pplan, profile_csv, out, slow)
    plan = load_plan(out)
    assert plan.parallel.hardware == "a100-80gb" and plan.parallel.hardware_spec.inter_node_bandwidth_bytes_per_s == 6.25e9
    sim = _simulate(pplan, out)
    for key in ("iteration_ms", "grad_sync_ms", "mfu"):
        assert sim[key] == pytest.approx(getattr(plan.predicted, key), rel=1e-12), key
    # the same plan without its recorded values (as written before they were) is priced on the preset
    data = json.loads(out.read_text())
    del data["parallel"]["hardware_spec"]
    older = tmp_path / "older.json"
    older.write_text(json.dumps(data))
    assert _simulate(pplan, older)["grad_sync_ms"] < 0.5 * sim["grad_sync_ms"]


def test_the_recorded_values_round_trip_byte_identically_under_a_hardware_files_keys(pplan, profile_csv, tmp_path):
    out = tmp_path / "plan.json"
    _partition(pplan, profile_csv, out, "a100-80gb")
    text = out.read_text()
    spec = json.loads(text)["parallel"]["hardware_spec"]
    assert spec == PRESETS["a100-80gb"].to_dict()  # what `pplan hardware a100-80gb --json` holds
    assert plan_to_json(plan_from_dict(json.loads(text))) == text
    assert load_plan(out).predicted is not None  # the prediction is of the plan with its values: kept on reading


@pytest.mark.parametrize("edit, words", [
    ({"gpus_per_nod": 8}, "did you mean 'gpus_per_node'"),
    ({"peak_bf16_flops_per_s": 312}, "peak_bf16_flops_per_s 312 FLOP/s is below"),
    ({"inter_node_latency_ms": "5s"}, "inter_node_latency_ms 5000 ms is beyond any real device"),
    ({"name": "h100-80gb"}, "parallel hardware 'a100-80gb' but its hardware_spec is named 'h100-80gb'"),
])
def test_a_hand_edited_hardware_spec_is_checked_as_a_hardware_file_is(pplan, profile_csv, tmp_path, edit, words):
    out = tmp_path / "plan.json"
    _partition(pplan, profile_csv, out, "a100-80gb")
    data = json.loads(out.read_text())
    data["parallel"]["hardware_spec"].update(edit)
    out.write_text(json.dumps(data))
    code, stdout, err = pplan("simulate", out)
    assert code == 2 and not stdout and words in err and len(err.strip().splitlines()) == 1, err


def test_a_misspelt_hardware_spec_key_is_refused_with_the_nearest(pplan, profile_csv, tmp_path):
    out = tmp_path / "plan.json"
    _partition(pplan, profile_csv, out, "a100-80gb")
    data = json.loads(out.read_text())
    data["parallel"]["hardware_spek"] = data["parallel"].pop("hardware_spec")
    out.write_text(json.dumps(data))
    code, _, err = pplan("simulate", out)
    assert code == 2 and "did you mean 'hardware_spec'" in err and len(err.strip().splitlines()) == 1


def test_a_hardware_what_if_takes_the_files_gpus_per_node(pplan, profile_csv, tmp_path):
    out = tmp_path / "plan.json"
    _partition(pplan, profile_csv, out, "a100-80gb")
    on_preset = _simulate(pplan, out, "--hardware", "a100-80gb")
    assert on_preset["iteration_ms"] == pytest.approx(load_plan(out).predicted.iteration_ms, rel=1e-12)
    # 4 GPUs per node hold 2 tensor-parallel groups, not 4: more pipeline boundaries cross the network
    four = _simulate(pplan, out, "--hardware", _hardware_file(tmp_path, "four.json", gpus_per_node=4))
    assert four["iteration_ms"] > on_preset["iteration_ms"]
    code, stdout, err = pplan("simulate", out, "--hardware", _hardware_file(tmp_path, "three.json", gpus_per_node=3))
    assert code == 2 and not stdout and len(err.strip().splitlines()) == 1
    assert "3 GPUs per node" in err and "tp=2" in err and "multiple of 2" in err


def test_without_hardware_the_plans_own_gpus_per_node_win_over_its_hardwares(pplan, profile_csv, tmp_path):
    out = tmp_path / "plan.json"
    _partition(pplan, profile_csv, out, "a100-80gb", "--gpus-per-node", 4, nodes=4)
    plan = load_plan(out)
    assert (plan.parallel.gpus_per_node, plan.parallel.hardware_spec.gpus_per_node) == (4, 8)
    predicted = plan.predicted.iteration_ms
    assert _simulate(pplan, out)["iteration_ms"] == pytest.approx(predicted, rel=1e-12)
    # the same hardware given again is no what-if: the plan as planned, its 4 GPUs per node kept
    assert _simulate(pplan, out, "--hardware", "a100-80gb")["iteration_ms"] == pytest.approx(predicted, rel=1e-12)


def test_recorded_gpus_per_node_must_hold_whole_tensor_parallel_groups():
    with pytest.raises(PplanError, match=r"tp=8 does not divide gpus_per_node 4"):
        ParallelConfig(dp=2, tp=8, gpus_per_node=4)


def test_a_hardware_spec_needs_the_plan_reader():
    spec = PRESETS["h100-80gb"].to_dict()
    with pytest.raises(TypeError):
        ParallelConfig.from_dict({"dp": 2, "hardware_spec": spec})
    cfg = ParallelConfig.from_dict({"dp": 2, "hardware": "h100-80gb", "hardware_spec": spec}, lambda d: Hardware(**{
        k: v for k, v in d.items() if k != "format"}))
    assert cfg.hardware_spec == PRESETS["h100-80gb"]


def test_the_zero_stage_hint_agrees_with_the_zero_option():
    with pytest.raises(PplanError) as e:
        ParallelConfig(zero=5)
    assert "2 the same (gradients stay whole at a pipeline's peak)" in e.value.hint
    assert "2 also the gradients" not in e.value.hint
