"""Cluster files, the device order along the pipeline, and heterogeneous plans."""

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from planner.cost import link_between, link_ms
from planner.cluster import EXACT_MAX, best_path, cluster_from_dict, exact_path, load_cluster, path_score, pipeline_orders
from planner.errors import ClusterError
from planner.partition import PartitionSettings, partition
from planner.partition.synthetic import uniform_layers
from planner.plan import Device, Links

from helpers.asserts import assert_file_refused

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "cluster.json"


def test_example_cluster_loads_as_a_graph():
    c = load_cluster(EXAMPLE)
    assert c.names == ["node0-gpu0", "node1-gpu0", "node0-gpu1", "node1-gpu1", "old-gpu"]
    assert c.graph.nodes["old-gpu"]["speed"] == 0.5 and c.graph.nodes["old-gpu"]["memory_bytes"] == 16 * 2**30
    assert c.graph.edges["node0-gpu0", "node0-gpu1"]["bandwidth"] == 300e9
    links = c.links(1e9, 1.0)
    assert links.bandwidth_bytes_per_s == 5e9 and links.between(0, 2) == (300e9, 0.005)
    devices = c.devices(None)
    assert [d.speed for d in devices] == [1.0, 1.0, 1.0, 1.0, 0.5]


@pytest.mark.parametrize("data, needle", [
    ([], "JSON object"),
    ({"devices": []}, "non-empty"),
    ({"devices": [{"name": "a"}, {"name": "a"}]}, "twice"),
    ({"devices": [{"name": "a", "speed": -1}]}, "speed"),
    ({"devices": [{"name": "a", "memory": "lots"}]}, "memory"),
    ({"devices": [{"name": "a"}, {"name": "b"}], "links": [{"a": "a", "b": "c", "bandwidth": "1GB/s"}]}, "unknown device 'c'"),
    ({"devices": [{"name": "a"}], "links": [{"a": "a", "b": "a", "bandwidth": "1GB/s"}]}, "itself"),
    ({"devices": [{"name": "a"}, {"name": "b"}], "links": [{"a": "a", "b": "b"}]}, "bandwidth"),
    ({"format": "pplan-cluster/9", "devices": [{"name": "a"}]}, "not supported"),
    ({"devices": [{"name": "a", "memroy": "1GiB"}]}, "devices[0]: unknown key 'memroy'; did you mean 'memory'?"),
    ({"devices": [{"name": "a"}], "default_link": {"bandwith": "1GB/s"}}, "unknown key 'bandwith'; did you mean 'bandwidth'?"),
    ({"devices": [{"name": "a"}, {"name": "b"}], "links": [{"a": "a", "b": "b", "bandwidth": "1GB/s", "latancy": 1}]},
     "links[0]: unknown key 'latancy'; did you mean 'latency'?"),
    ({"devices": [{"name": "a"}], "link": []}, "unknown key 'link'; did you mean 'links'?"),
    ({"devices": [{"name": "a", "speed": 1e-9}]}, "speed"),
    ({"devices": [{"name": "a", "memory": 10**400}]}, "out of range"),
    ({"devices": [{"name": "a"}], "description": 5}, "description"),
])
def test_bad_cluster_descriptions_are_one_line_errors(data, needle):
    with pytest.raises(ClusterError) as info:
        cluster_from_dict(data)
    assert needle in info.value.one_line() and "\n" not in info.value.one_line()


@pytest.mark.parametrize("text, match", [
    ("{not json", "invalid JSON"),
    ('{"devices": [{"name": "a", "name": "b"}]}', "appears twice"),
    ('{"devices": [{"name": "a", "speed": 1e400}]}', "out of range"),
])
def test_unreadable_cluster_files(tmp_path, text, match):
    assert_file_refused(load_cluster, tmp_path / "c.json", text, ClusterError, match)


def test_missing_cluster_file(tmp_path):
    with pytest.raises(ClusterError, match="does not exist"):
        load_cluster(tmp_path / "missing.json")


def _random_links(rng, n):
    pairs = tuple((a, b, float(rng.choice([1e9, 5e9, 25e9, 300e9])), float(rng.choice([0.005, 0.02])))
                  for a in range(n) for b in range(a + 1, n) if rng.random() < 0.7)
    return Links(bandwidth_bytes_per_s=1e9, latency_ms=0.05, pairs=pairs)


def test_exact_path_matches_enumeration_of_all_orders():
    rng = np.random.default_rng(11)
    for _ in range(30):
        n = int(rng.integers(3, 7))
        links = _random_links(rng, n)
        path = best_path(links, n, 1e6)
        cost = [[0.0 if a == b else link_ms(1e6, link_between(links, a, b)) for b in range(n)] for a in range(n)]
        best = min(path_score(cost, p) for p in itertools.permutations(range(n)))
        assert sorted(path) == list(range(n))
        assert path_score(cost, path) == pytest.approx(best)


def test_large_clusters_use_the_heuristic_and_return_an_order():
    rng = np.random.default_rng(5)
    n = EXACT_MAX + 4
    links = _random_links(rng, n)
    path = best_path(links, n, 1e6)
    cost = [[0.0 if a == b else link_ms(1e6, link_between(links, a, b)) for b in range(n)] for a in range(n)]
    assert sorted(path) == list(range(n))
    assert path_score(cost, path) <= path_score(cost, tuple(range(n)))
    small = exact_path([row[:8] for row in cost[:8]])
    assert sorted(small) == list(range(8))


def test_orders_include_both_directions_and_memory_first():
    devices = (Device("a", 10), Device("b", 30), Device("c", 20))
    links = Links(bandwidth_bytes_per_s=1e9, latency_ms=0.0, pairs=((0, 2, 1e11, 0.0), (1, 2, 1e11, 0.0)))
    orders = pipeline_orders(devices, links, 1e6)
    assert orders[0] in ((0, 2, 1), (1, 2, 0)) and orders[1] == tuple(reversed(orders[0]))
    assert (1, 2, 0) in orders


def test_slow_devices_get_less_work_and_neighbours_share_fast_links(tmp_path):
    cluster = {
        "devices": [{"name": "fast0"}, {"name": "far"}, {"name": "fast1"}, {"name": "slow", "speed": 0.5}],
        "default_link": {"bandwidth": "0.5GB/s", "latency": "0.1ms"},
        "links": [{"a": "fast0", "b": "fast1", "bandwidth": "300GB/s"}, {"a": "fast1", "b": "slow", "bandwidth": "300GB/s"},
                  {"a": "far", "b": "fast0", "bandwidth": "300GB/s"}],
    }
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(cluster))
    prof = uniform_layers(n_layers=24, out_bytes=4e6)
    res = partition(prof, PartitionSettings(n_devices=None, memory_bytes=None, global_batch=8, cluster=load_cluster(path),
                                            schedule="1f1b", microbatches=8))
    names = [res.plan.devices[st.device].name for st in res.plan.stages]
    assert names in (["far", "fast0", "fast1", "slow"], ["slow", "fast1", "fast0", "far"])
    sizes = {res.plan.devices[st.device].name: st.layers[1] - st.layers[0] for st in res.plan.stages}
    assert sizes["slow"] < min(sizes["fast0"], sizes["fast1"], sizes["far"])
    assert 2 * sizes["slow"] >= min(sizes["fast0"], sizes["fast1"]) - 2  # about half the work at half the speed
    assert len(res.plan.links.pairs) == 3


def test_cluster_device_count_must_match(tmp_path):
    prof = uniform_layers(n_layers=8)
    with pytest.raises(ClusterError, match="has 5 devices"):
        partition(prof, PartitionSettings(n_devices=3, memory_bytes=None, global_batch=8, cluster=load_cluster(EXAMPLE)))
