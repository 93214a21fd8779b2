"""A bandwidth below 1 B/s (or above 1 PB/s), on the command line or in a cluster file, is refused
where it is written: the cluster file's name, the link and the value as written. Before, 0.5B/s
passed the parser (it checked only > 0) and the plan's reader refused `links.pairs[0]` instead."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.cluster import cluster_from_dict
from planner.errors import ClusterError, PplanError
from planner.limits import MAX_BANDWIDTH, MIN_BANDWIDTH
from planner.units import parse_bandwidth

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("text", ["0.5B/s", "1e-300GB/s", "7bit/s", 0.5, 1e-300, "2PB/s", 2e15])
def test_out_of_range_bandwidths_are_refused_with_the_range(text) -> None:
    with pytest.raises(PplanError) as e:
        parse_bandwidth(text)
    assert e.value.message.startswith(f"bandwidth {text!r}")
    assert f"out of range ({MIN_BANDWIDTH:g} to {MAX_BANDWIDTH:g} bytes/s)" in e.value.message


@pytest.mark.parametrize("text, value", [("1B/s", MIN_BANDWIDTH), ("8bit/s", 1.0), ("1PB/s", MAX_BANDWIDTH), (1, 1.0),
                                         ("25GB/s", 25e9)])
def test_the_ends_of_the_range_parse(text, value) -> None:
    assert parse_bandwidth(text) == value


def _cluster() -> dict:
    return json.loads((ROOT / "examples" / "cluster.json").read_text())


def test_cluster_link_names_file_link_and_value() -> None:
    data = _cluster()
    data["links"][0]["bandwidth"] = "0.5B/s"
    with pytest.raises(ClusterError) as e:
        cluster_from_dict(data, source="c.json")
    assert e.value.message.startswith("c.json: links[0].bandwidth: bandwidth '0.5B/s' (0.5 bytes/s) is below 1e+06 bytes/s")


def test_cluster_default_link_names_file_and_value() -> None:
    data = _cluster()
    data["default_link"]["bandwidth"] = "1e-300GB/s"
    with pytest.raises(ClusterError) as e:
        cluster_from_dict(data, source="c.json")
    assert e.value.message.startswith("c.json: default_link.bandwidth: bandwidth '1e-300GB/s' (1e-291 bytes/s) is below 1e+06 bytes/s")


def test_partition_names_the_cluster_file(pplan, tmp_path: Path) -> None:
    data = _cluster()
    data["links"][1]["bandwidth"] = 0.5
    cluster = tmp_path / "slow.json"
    cluster.write_text(json.dumps(data))
    code, _, err = pplan("partition", ROOT / "profiles" / "mlp.csv", "--global-batch", "64", "--cluster", cluster,
                         "-o", tmp_path / "plan.json")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"{cluster}: links[1].bandwidth: bandwidth 0.5 is below 1e+06 bytes/s" in err and "links.pairs" not in err


@pytest.mark.parametrize("command", ["partition", "simulate"])
def test_a_link_bandwidth_below_a_megabyte_per_second_on_the_command_line_is_a_unit_slip(pplan, tmp_path, command):
    """--bandwidth 300 meant 300GB/s and priced every hand-over at 300 bytes/s; a cluster or hardware
    file's link is held to the same bound (planner.limits.MIN_LINK_BANDWIDTH)."""
    plan = ROOT / "tests" / "data" / "sim_plan.json"
    args = (["partition", ROOT / "profiles" / "mlp.csv", "-n", 2, "--global-batch", 8, "-o", tmp_path / "p.json"]
            if command == "partition" else ["simulate", plan, "--profile", ROOT / "tests" / "data" / "sim_profile.csv"])
    code, out, err = pplan(*args, "--bandwidth", "300")
    assert code == 2 and out == "" and not (tmp_path / "p.json").exists()
    assert err.strip() == ("pplan: error: --bandwidth '300' (300 bytes/s) is below 1e+06 bytes/s (1MB/s), slower than "
                           'any real link; a plain number is bytes/s: write the unit, e.g. "25GB/s" or "200Gbit/s"')
    code, _, err = pplan(*args, "--bandwidth", "1MB/s")
    assert code == 0, err
    code, _, err = pplan(*args, "--bandwidth", "0")  # the range it names is the one that holds
    assert code == 2 and "--bandwidth '0' is out of range (1e+06 to 1e+15 bytes/s); give a value from 1MB/s to 1PB/s" in err
