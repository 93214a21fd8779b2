"""Hardware presets and user JSON files (planner.hardware) and `pplan hardware`."""

import json
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from planner.errors import ClusterError, PplanError
from planner.hardware import PRESETS, Hardware, hardware_from_dict, load_hardware

ROOT = Path(__file__).resolve().parents[1]


DOCUMENTED = {
    "a100-40gb": (312e12, 19.5e12, 40e9, 1.555e12, 300e9, 200e9 / 8),
    "a100-80gb": (312e12, 19.5e12, 80e9, 2.039e12, 300e9, 200e9 / 8),
    "h100-80gb": (989e12, 67e12, 80e9, 3.35e12, 450e9, 400e9 / 8),
    "h200": (989e12, 67e12, 141e9, 4.8e12, 450e9, 400e9 / 8),
    "cpu": (96e9, 96e9, 12 * 2**30, 16e9, 2.5e9, 1.25e9),
}


@pytest.mark.parametrize("name", sorted(DOCUMENTED))
def test_presets_have_the_documented_numbers(name):
    hw = load_hardware(name)
    assert hw is PRESETS[name] and hw.name == name and hw.source
    got = (hw.peak_bf16_flops_per_s, hw.peak_fp32_flops_per_s, hw.memory_bytes, hw.memory_bandwidth_bytes_per_s,
           hw.intra_node_bandwidth_bytes_per_s, hw.inter_node_bandwidth_bytes_per_s)
    assert got == pytest.approx(DOCUMENTED[name], rel=1e-12)
    assert hw.gpus_per_node == (2 if name == "cpu" else 8)
    assert hw.peak_flops_per_s("float32") == hw.peak_fp32_flops_per_s
    assert hw.peak_flops_per_s("bfloat16") == hw.peak_flops_per_s("float16") == hw.peak_bf16_flops_per_s
    assert name in (ROOT / "docs" / "hardware.md").read_text()


def test_every_field_has_a_docstring_line_and_the_dataclass_is_frozen():
    import inspect

    source = inspect.getsource(Hardware)
    for f in fields(Hardware):
        assert f'{f.name}: ' in source
    with pytest.raises(Exception):
        PRESETS["h200"].memory_bytes = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        PRESETS["new"] = PRESETS["h200"]  # type: ignore[index]
    with pytest.raises(PplanError, match="dtype"):
        PRESETS["h200"].peak_flops_per_s("int8")


def test_json_round_trip_and_unit_strings(tmp_path):
    for hw in PRESETS.values():
        path = tmp_path / f"{hw.name}.json"
        path.write_text(json.dumps(hw.to_dict()))
        assert load_hardware(path) == hw
    data = {k: v for k, v in PRESETS["a100-80gb"].to_dict().items() if k not in ("format", "source")}
    data.update(name="mine", memory_bytes="80GiB", memory_bandwidth_bytes_per_s="2TB/s", inter_node_bandwidth_bytes_per_s="200Gbit/s",
                intra_node_latency_ms="5us", gpus_per_node=4)
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(data))
    hw = load_hardware(str(path))
    assert (hw.memory_bytes, hw.memory_bandwidth_bytes_per_s, hw.inter_node_bandwidth_bytes_per_s) == (80 * 2**30, 2e12, 25e9)
    assert hw.intra_node_latency_ms == pytest.approx(0.005) and hw.gpus_per_node == 4
    assert hw.source == f"user file {path}"


def _base() -> dict:
    return PRESETS["h100-80gb"].to_dict()


@pytest.mark.parametrize("change, words", [
    ({"memory_bytes": -1}, "positive"),
    ({"peak_bf16_flops_per_s": 0}, "positive"),
    ({"peak_fp32_flops_per_s": 1e30}, "beyond any real device"),
    ({"memory_bandwidth_bytes_per_s": True}, "must be a number"),
    ({"peak_bf16_flops_per_s": "fast"}, "not a number"),
    ({"gpus_per_node": 0}, "at least 1"),
    ({"gpus_per_node": 2.5}, "whole number"),
    ({"inter_node_latency_ms": "-1ms"}, "negative"),
    ({"name": ""}, "non-empty"),
    ({"name": "a\nb"}, "one line"),
    ({"format": "pplan-hardware/9"}, "not supported"),
    ({"memory_bytes": "80 parsecs"}, "unit"),
])
def test_bad_values_are_refused_with_the_key(change, words):
    data = {**_base(), **change}
    with pytest.raises(ClusterError, match=words) as info:
        hardware_from_dict(data, "my.json")
    assert "my.json" in str(info.value) and "\n" not in str(info.value)


def test_missing_keys_and_wrong_shapes():
    data = _base()
    del data["memory_bytes"]
    with pytest.raises(ClusterError, match="missing key.*memory_bytes"):
        hardware_from_dict(data, "x.json")
    with pytest.raises(ClusterError, match="JSON object"):
        hardware_from_dict([1, 2], "x.json")
    latency_zero = {**_base(), "intra_node_latency_ms": 0}
    assert hardware_from_dict(latency_zero).intra_node_latency_ms == 0  # a what-if with free messages is allowed


def test_unknown_preset_suggests_the_nearest():
    with pytest.raises(ClusterError, match="did you mean 'a100-80gb'"):
        load_hardware("a100-80gib")
    with pytest.raises(ClusterError, match="does not exist"):
        load_hardware("nowhere/hw.json")
    for blank in ("", "  "):  # not the current folder, named as a directory the user never gave
        with pytest.raises(ClusterError, match="hardware name is empty"):
            load_hardware(blank)


def test_cli_refuses_a_typo_key_in_one_line_with_a_suggestion(pplan, tmp_path):
    data = _base()
    data["memory_bandwith_bytes_per_s"] = data.pop("memory_bandwidth_bytes_per_s")
    path = tmp_path / "my.json"
    path.write_text(json.dumps(data))
    code, out, err = pplan("hardware", path)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "unknown key 'memory_bandwith_bytes_per_s'" in err
    assert "did you mean 'memory_bandwidth_bytes_per_s'" in err


def test_cli_lists_presets_and_shows_one(pplan, tmp_path):
    code, out, _ = pplan("hardware")
    assert code == 0
    header, *rows = out.strip().splitlines()
    for column in ("bf16 TFLOP/s", "fp32 TFLOP/s", "memory GiB", "mem BW TB/s", "intra GB/s", "inter GB/s"):
        assert column in header
    assert [r.split()[0] for r in rows] == list(PRESETS)
    assert rows[2].split()[1:3] == ["989", "67"]  # h100-80gb
    code, out, _ = pplan("hardware", "--json")
    assert code == 0 and [d["name"] for d in json.loads(out)] == list(PRESETS)
    code, out, _ = pplan("hardware", "h200", "--json")
    assert code == 0
    path = tmp_path / "h200.json"
    path.write_text(out)  # what --json prints is a valid user file
    assert load_hardware(path) == PRESETS["h200"]
    code, out, _ = pplan("hardware", path)
    assert code == 0 and "h200" in out and "source:" in out and "141000000000 bytes" in out


def test_planning_modules_import_without_torch_or_matplotlib():
    code = ("import sys, planner.hardware, planner.profiling.analytic\n"
            "bad = [m for m in ('torch', 'matplotlib') if m in sys.modules]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_a_hardware_is_valid_by_construction():
    from dataclasses import replace

    with pytest.raises(ClusterError, match="memory_bandwidth_bytes_per_s must be positive"):
        replace(PRESETS["h200"], memory_bandwidth_bytes_per_s=0.0)
    with pytest.raises(ClusterError, match="name must be one line"):
        replace(PRESETS["h200"], name="two\nlines")
    assert replace(PRESETS["h200"], name="h200-half", memory_bytes=70 * 10**9).memory_bytes == 70e9
