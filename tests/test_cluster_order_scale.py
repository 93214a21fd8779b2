"""The pipeline order of large clusters: the same order as the O(n^3) heuristic it replaced, costs
read once per listed pair, and a one-line refusal above the bound the ordering handles."""

from __future__ import annotations

import numpy as np
import pytest

from planner.cluster import EXACT_MAX, MAX_ORDER_DEVICES, best_path, pipeline_orders
from planner.cost import link_between, link_ms
from planner.errors import ClusterError
from planner.plan import Device, Links


# ---- REFERENCE: the ordering heuristic as it was before it scaled (planner/cluster.py, 2026-12-03), --
# ---- copied unchanged but for the names; best_path used it for more than EXACT_MAX devices. --------

def _ref_hop_costs(links, n, nbytes):
    return [[0.0 if a == b else link_ms(max(nbytes, 1.0), link_between(links, a, b)) for b in range(n)] for a in range(n)]


def _ref_path_score(cost, path):
    hops = [cost[a][b] for a, b in zip(path, path[1:])]
    return (max(hops, default=0.0), sum(hops))


def _ref_nearest_neighbour(cost):
    n = len(cost)
    best = None
    for start in range(n):
        path, left = [start], set(range(n)) - {start}
        while left:
            nxt = min(left, key=lambda u: (cost[path[-1]][u], u))
            path.append(nxt)
            left.remove(nxt)
        if best is None or _ref_path_score(cost, path) < _ref_path_score(cost, best):
            best = path
    return best


def _ref_two_opt(cost, path, rounds=20):
    n = len(path)
    score = _ref_path_score(cost, path)
    for _ in range(rounds):
        improved = False
        for i in range(n - 1):
            for j in range(i + 1, n):
                cand = path[:i] + path[i:j + 1][::-1] + path[j + 1:]
                sc = _ref_path_score(cost, cand)
                if sc < score:
                    path, score, improved = cand, sc, True
        if not improved:
            break
    return _ref_canonical(tuple(path))


def _ref_canonical(path):
    return path if path[0] <= path[-1] else tuple(reversed(path))


def _reference_path(links, n, nbytes):
    cost = _ref_hop_costs(links, n, nbytes)
    return _ref_two_opt(cost, _ref_nearest_neighbour(cost))

# ---- end of REFERENCE -------------------------------------------------------------------------------


def _random_links(rng: np.random.Generator, n: int) -> Links:
    """A few link kinds (ties between equal links are most of what the heuristic decides) at a random density."""
    kinds = [(float(rng.choice([1e9, 3e9, 5e9, 25e9, 300e9])), float(rng.choice([0.0, 0.005, 0.02]))) for _ in range(int(rng.integers(1, 5)))]
    density = float(rng.choice([0.02, 0.1, 0.5, 0.9]))
    pairs = tuple((a, b, *kinds[int(rng.integers(len(kinds)))]) for a in range(n) for b in range(a + 1, n) if rng.random() < density)
    return Links(bandwidth_bytes_per_s=float(rng.choice([1e9, 25e9, 300e9])), latency_ms=float(rng.choice([0.0, 0.01])), pairs=pairs)


def _nodes(n: int, per_node: int) -> Links:
    """Nodes of `per_node` devices, every pair inside a node on a fast link, nodes on the default."""
    pairs = tuple((a, b, 300e9, 0.005) for a in range(n) for b in range(a + 1, n) if a // per_node == b // per_node)
    return Links(bandwidth_bytes_per_s=25e9, latency_ms=0.01, pairs=pairs)


@pytest.mark.parametrize("seed", range(6))
def test_random_clusters_get_the_order_the_old_heuristic_chose(seed):
    rng = np.random.default_rng(seed)
    for _ in range(8):
        n = int(rng.integers(EXACT_MAX + 1, 30))
        links, nbytes = _random_links(rng, n), float(rng.choice([1.0, 12345.0, 1e6, 3.3e6]))
        assert best_path(links, n, nbytes) == _reference_path(links, n, nbytes), (seed, n, links)


@pytest.mark.parametrize("seed", range(4))
def test_uniform_clusters_with_a_few_fast_links_get_the_old_order(seed):
    # near-ties everywhere: sum()'s rounding decides many reversals, and equal hop sequences share one sum
    rng = np.random.default_rng(100 + seed)
    for _ in range(4):
        n = int(rng.integers(20, 64))
        ends = rng.integers(0, n, (int(rng.integers(1, 6)), 2))
        pairs = tuple(sorted({(int(min(a, b)), int(max(a, b)), float(rng.choice([100e9, 300e9])), 0.005) for a, b in ends if a != b}))
        links = Links(bandwidth_bytes_per_s=25e9, latency_ms=0.01, pairs=pairs)
        assert best_path(links, n, 2.0**20) == _reference_path(links, n, 2.0**20), (seed, n, pairs)


@pytest.mark.parametrize("n, fast", [
    (26, ((4, 13, 100e9), (5, 25, 100e9), (13, 24, 100e9))),
    (35, ((2, 25, 100e9), (4, 26, 300e9), (25, 27, 100e9))),
    (29, ((4, 25, 300e9), (8, 11, 100e9), (17, 25, 100e9))),
    (17, ((1, 16, 100e9), (4, 14, 300e9), (6, 14, 100e9), (12, 14, 100e9))),
])
def test_near_ties_that_reorder_the_same_hops_are_summed_as_the_old_heuristic_did(n, fast):
    # found by search: here sharing one sum between reversals that do not make the same hop sequence
    # changes the order (the reversals' sums differ in the last bit)
    links = Links(bandwidth_bytes_per_s=25e9, latency_ms=0.01, pairs=tuple((a, b, bw, 0.005) for a, b, bw in fast))
    assert best_path(links, n, 2.0**20) == _reference_path(links, n, 2.0**20)


@pytest.mark.parametrize("links", [
    Links(bandwidth_bytes_per_s=25e9, latency_ms=0.01),  # every hop the same: all candidates tie
    Links(bandwidth_bytes_per_s=25e9, latency_ms=0.01, pairs=((40, 13, 300e9, 0.005), (7, 66, 300e9, 0.005))),  # near-ties
    Links(bandwidth_bytes_per_s=25e9, latency_ms=0.01, pairs=tuple((0, b, 1e9, 0.5) for b in range(1, 90))),  # device 0 visited last
    _nodes(90, 8),
], ids=["uniform", "two-fast-links", "one-slow-device", "8-gpu-nodes"])
def test_clusters_of_more_than_64_devices_get_the_old_order(links):
    # 90 devices: a walk's look-up of the least unvisited device crosses 64-device words
    assert best_path(links, 90, 2.0**20) == _reference_path(links, 90, 2.0**20)


def test_hop_costs_are_read_once_per_listed_pair_not_per_device_pair(monkeypatch):
    import planner.cost.device_path as device_path

    calls = []
    monkeypatch.setattr(device_path, "link_ms", lambda *a: calls.append(a) or link_ms(*a))
    links = _nodes(64, 8)
    path = best_path(links, 64, 1e6)
    assert sorted(path) == list(range(64))
    assert len(calls) == len(links.pairs) + 1  # the old heuristic priced all 64 x 63 pairs


def test_many_devices_in_nodes_are_ordered_node_by_node():
    n = 512  # the old heuristic took 23 s here (and over 120 s for 1,024)
    path = best_path(_nodes(n, 8), n, 2.0**20)
    assert sorted(path) == list(range(n))
    node_of = [d // 8 for d in path]
    assert sum(a != b for a, b in zip(node_of, node_of[1:])) == n // 8 - 1  # one default hop between nodes


def test_more_devices_than_the_ordering_handles_is_a_one_line_error():
    n = MAX_ORDER_DEVICES + 1
    with pytest.raises(ClusterError) as info:
        best_path(Links(bandwidth_bytes_per_s=25e9, latency_ms=0.01), n, 1e6)
    line = info.value.one_line()
    assert f"{n:,}" in line and f"{MAX_ORDER_DEVICES:,}" in line and "\n" not in line and info.value.hint
    devices = tuple(Device(f"d{i}", 2**30) for i in range(n))
    with pytest.raises(ClusterError, match=f"{MAX_ORDER_DEVICES:,}"):
        pipeline_orders(devices, Links(bandwidth_bytes_per_s=25e9, latency_ms=0.01), 1e6)
