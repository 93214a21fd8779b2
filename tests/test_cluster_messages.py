"""The messages of cluster planning say what holds: a cluster link's bandwidth has a plausible lower
bound (a plain 300 meant as 300GB/s is refused, as a hardware file refuses it), a latency out of
range names the range, `pplan simulate` shows tensor-parallel collectives only where tp > 1, and the
help of `partition -n` and `--grad-sync` says what happens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.cluster import cluster_from_dict
from planner.errors import ClusterError, PplanError
from planner.limits import MAX_LATENCY_MS, MIN_LINK_BANDWIDTH
from planner.units import parse_ms

ROOT = Path(__file__).resolve().parents[1]
SMALL_GPT = "gpt:layers=4,hidden=256,heads=4,seq=128,vocab=1000"


def _cluster() -> dict:
    return json.loads((ROOT / "examples" / "cluster.json").read_text())


def _refusal(data: dict) -> ClusterError:
    with pytest.raises(ClusterError) as e:
        cluster_from_dict(data, source="c.json")
    assert "\n" not in e.value.one_line()
    return e.value


def test_a_plain_link_bandwidth_below_a_megabyte_a_second_is_refused_with_the_bound() -> None:
    data = _cluster()
    data["links"][0]["bandwidth"] = 300  # meant as 300GB/s, read as 300 bytes/s
    e = _refusal(data)
    assert e.message == ("c.json: links[0].bandwidth: bandwidth 300 is below 1e+06 bytes/s (1MB/s), "
                         "slower than any real link")
    assert "25GB/s" in e.hint and "plain number is bytes/s" in e.hint


def test_a_default_link_with_units_below_the_bound_names_its_bytes() -> None:
    data = _cluster()
    data["default_link"]["bandwidth"] = "300B/s"
    assert _refusal(data).message.startswith("c.json: default_link.bandwidth: bandwidth '300B/s' (300 bytes/s) is below 1e+06")


def test_link_bandwidths_from_the_bound_up_are_read() -> None:
    data = _cluster()
    data["links"][0]["bandwidth"] = "1MB/s"
    data["default_link"]["bandwidth"] = MIN_LINK_BANDWIDTH
    cluster = cluster_from_dict(data)
    assert cluster.default_bandwidth == MIN_LINK_BANDWIDTH
    assert MIN_LINK_BANDWIDTH in {d["bandwidth"] for _, _, d in cluster.graph.edges(data=True)}
    cluster_from_dict(_cluster())  # the example's slowest link, 5GB/s, is far above it


def test_partition_refuses_a_unit_slip_in_one_line_and_writes_no_plan(pplan, tmp_path: Path) -> None:
    data = _cluster()
    data["links"][1]["bandwidth"] = 300
    cluster, out = tmp_path / "slip.json", tmp_path / "plan.json"
    cluster.write_text(json.dumps(data))
    code, _, err = pplan("partition", ROOT / "profiles" / "mlp.csv", "--global-batch", "64", "--cluster", cluster, "-o", out)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert f"{cluster}: links[1].bandwidth: bandwidth 300 is below 1e+06 bytes/s" in err and "25GB/s" in err
    assert not out.exists()


def test_a_negative_latency_says_so_once() -> None:
    data = _cluster()
    data["links"][0]["latency"] = -1
    assert _refusal(data).message == "c.json: links[0].latency: latency -1 is negative"
    with pytest.raises(PplanError) as e:
        parse_ms(1e9)
    assert e.value.message == f"latency 1000000000.0 is out of range (0 to {MAX_LATENCY_MS:g} ms)"


def test_an_integer_too_large_for_a_float_names_the_most_the_field_takes() -> None:
    e = _refusal({"devices": [{"name": "a", "memory": 10**400}]})
    assert e.message.startswith("c.json: devices[0].memory is out of range: an integer of 401 digits, the most is ")
    assert e.message.endswith(" bytes")


def _parallel_plan(pplan, tmp_path: Path, layout: str, hardware: str = "a100-80gb") -> tuple[Path, str]:
    profile, out = tmp_path / "gpt.csv", tmp_path / f"{layout.replace(',', '_').replace('=', '')}.json"
    if not profile.exists():
        code, _, err = pplan("profile", "--analytic", "--model", SMALL_GPT, "--hardware", "a100-80gb", "--dtype", "bfloat16",
                             "-b", "1,2", "-o", profile)
        assert code == 0, err
    code, _, err = pplan("partition", profile, "--nodes", 1, "--gpus-per-node", 4, "--hardware", hardware,
                         "--global-batch", 8, "--parallel", layout, "-o", out)
    assert code == 0, err
    return out, err


def test_simulate_shows_only_the_communication_the_layout_has(pplan, tmp_path: Path) -> None:
    no_tp, _ = _parallel_plan(pplan, tmp_path, "dp=2,pp=2,tp=1")
    code, stdout, err = pplan("simulate", no_tp)
    assert code == 0, err
    comm = next(line for line in stdout.splitlines() if line.startswith("comm "))
    assert "gradient sync" in comm and "tensor-parallel" not in comm
    tp2, _ = _parallel_plan(pplan, tmp_path, "dp=1,pp=2,tp=2")
    code, stdout, err = pplan("simulate", tp2)
    assert code == 0, err
    comm = next(line for line in stdout.splitlines() if line.startswith("comm "))
    assert "tensor-parallel collectives" in comm and "gradient sync" not in comm  # dp=1: no sync, none printed


def test_the_hardware_mismatch_warning_names_the_hardware_without_a_quoted_possessive(pplan, tmp_path: Path) -> None:
    _, err = _parallel_plan(pplan, tmp_path, "dp=2,pp=2,tp=1", hardware="h100-80gb")
    assert "but the plan uses the peak and memory of 'h100-80gb';" in err
    assert "''s" not in err and "'s peak" not in err


def _partition_help(param: str) -> str:
    from typer.main import get_command

    from cli.app import app

    return next(p.help for p in get_command(app).commands["partition"].params if p.name == param)  # type: ignore[attr-defined]


def test_partition_help_says_what_devices_does_with_a_cluster_and_who_overlaps_the_sync() -> None:
    devices = _partition_help("devices")
    assert "any other is refused" in devices and "default with --cluster" not in devices
    grad_sync = _partition_help("grad_sync")
    assert "Megatron-LM 2021 did not overlap" in grad_sync  # as docs/parallel.md says
    assert "as Megatron-LM, DeepSpeed and DDP run it" not in grad_sync


def test_a_hardware_files_negative_latency_names_its_key_once() -> None:
    from planner.hardware import PRESETS, hardware_from_dict

    with pytest.raises(PplanError) as e:
        hardware_from_dict({**PRESETS["h100-80gb"].to_dict(), "inter_node_latency_ms": -1}, source="hw.json")
    assert e.value.message == "hw.json: inter_node_latency_ms: latency -1 is negative"
