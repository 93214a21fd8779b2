"""Skip edges at scale: the fast paths equal the old scans, edges are validated once, and the
reader count of a profile's `# edge:` lines is bounded where it is read.

The references below are the per-layer and per-stage scans the planner used before (every
edge, validated afresh, for every layer or stage); the fast paths must give the same floats.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from planner.errors import ProfileError
from planner.graph import SkipEdge, layer_input_bytes, layer_inputs, passthrough_bytes
from planner.graph import crossing
from planner.graph.edges import MAX_EDGES_PER_LAYER, MAX_READERS_PER_LAYER, read_edges
from planner.partition.problem import passthrough_table, stage_passthrough

from helpers.problems import random_problem


def _random_edges(rng: np.random.Generator, n: int, count: int, fractional: bool = False) -> tuple[SkipEdge, ...]:
    edges = set()
    for _ in range(count):
        src = int(rng.integers(0, n - 2))
        dst = int(rng.integers(src + 2, n))
        inner = list(range(src + 1, dst))
        k = int(rng.integers(0, min(len(inner), 4) + 1))
        also = tuple(sorted(int(c) for c in rng.choice(inner, size=k, replace=False))) if k else ()
        size = float(rng.integers(0, 1000)) + (float(rng.random()) if fractional else 0.0)
        edges.add(SkipEdge(src, dst, size if fractional else int(size), also))
    return tuple(sorted(edges))


def _old_passthrough(first: int, end: int, edges, micro_batch_size: int = 1) -> float:
    total = 0
    for e in edges:
        e = SkipEdge(int(e[0]), int(e[1]), int(round(float(e[2]))), tuple(sorted(set(e[3]))) if len(e) == 4 else ())
        if e.src < first and e.dst >= end and not any(first <= c < end for c in e.also_to):
            total += e.bytes_per_sample
    return float(total * micro_batch_size)


def _old_table(edges, n_layers: int) -> np.ndarray:
    diff = np.zeros((n_layers + 2, n_layers + 2))
    for e in edges:
        points = (e.src,) + tuple(e.also_to) + (e.dst,)
        for a, b in zip(points, points[1:]):
            w = float(e.bytes_per_sample)
            diff[a + 1, a + 1] += w
            diff[a + 1, b + 1] -= w
            diff[b + 1, a + 1] -= w
            diff[b + 1, b + 1] += w
    return diff.cumsum(axis=0).cumsum(axis=1)[: n_layers + 1, : n_layers + 1]


def test_layer_inputs_equal_the_per_layer_scan_on_random_models():
    rng = np.random.default_rng(11)
    for case in range(150):
        n = int(rng.integers(3, 14))
        edges = _random_edges(rng, n, int(rng.integers(0, 3 * n)))
        out = rng.random(n) * 1e4 if case % 2 else rng.integers(0, 1000, n).astype(float)
        mbs, inp = int(rng.integers(1, 9)), float(rng.integers(0, 100))
        old = np.array([inp] + [layer_input_bytes(i, out, edges, mbs) for i in range(1, n)])
        assert layer_inputs(n, out, edges, mbs, inp).tolist() == old.tolist(), (case, edges)
        plain = [tuple(e) for e in edges]  # (src, dst, bytes, also_to) tuples, not cached
        assert layer_inputs(n, out, plain, mbs, inp).tolist() == old.tolist(), case


def test_passthrough_equals_the_per_edge_scan_for_every_stage():
    rng = np.random.default_rng(12)
    for case in range(120):
        n = int(rng.integers(3, 12))
        edges = _random_edges(rng, n, int(rng.integers(0, 3 * n)), fractional=case % 3 == 0)
        mbs = int(rng.integers(1, 5))
        forms = (edges, list(edges), tuple(tuple(e[:3]) + (list(e[3]),) for e in edges))
        for first in range(n):
            for end in range(first + 1, n + 1):
                want = _old_passthrough(first, end, edges, mbs)
                assert [passthrough_bytes(first, end, f, mbs) for f in forms] == [want] * 3, (case, first, end)


def test_passthrough_sums_past_int64_stay_exact():
    big = 2**62
    edges = (SkipEdge(0, 5, big), SkipEdge(0, 4, big), SkipEdge(1, 5, big + 3))
    assert passthrough_bytes(2, 4, edges) == float(3 * big + 3)
    assert passthrough_bytes(2, 4, edges, micro_batch_size=3) == float((3 * big + 3) * 3)


def test_equal_edge_sets_in_new_tuples_and_many_sets_in_turn_give_their_own_answer():
    rng = np.random.default_rng(13)
    sets = [_random_edges(rng, 9, 12) for _ in range(3 * crossing._CACHED_EDGE_SETS)]
    for _ in range(2):  # the second round runs after every first-round entry was evicted
        for edges in sets:
            copy = tuple(SkipEdge(*e) for e in edges)  # equal, not the same objects
            for first, end in ((1, 3), (2, 7), (4, 5)):
                want = _old_passthrough(first, end, edges)
                assert passthrough_bytes(first, end, edges) == want
                assert passthrough_bytes(first, end, copy) == want


def test_passthrough_table_is_the_same_floats_as_the_gap_loop():
    rng = np.random.default_rng(14)
    for case in range(80):
        p = random_problem(rng, "auto", max_layers=12)
        n = p.n_layers
        edges = _random_edges(rng, n, int(rng.integers(1, 3 * n)), fractional=case % 2 == 1) if n >= 3 else ()
        p = dataclasses.replace(p, passthrough_edges=edges)
        if not edges:
            assert passthrough_table(p) is None
            continue
        table = passthrough_table(p)
        assert table.shape == (n + 1, n + 1)
        assert table.tobytes() == _old_table(edges, n).tobytes(), case
        if case % 2 == 0:  # whole bytes: the table is what each stage forwards
            for i in range(n):
                for j in range(i + 1, n + 1):
                    assert table[i, j] == stage_passthrough(p, i, j), (case, i, j)


def test_a_large_model_validates_its_edges_once_not_once_per_layer_or_stage(monkeypatch):
    rng = np.random.default_rng(15)
    n = 400
    edges = _random_edges(rng, n, 8 * n)
    calls = []
    real = crossing.as_skip_edges
    monkeypatch.setattr(crossing, "as_skip_edges", lambda e: calls.append(1) or real(e))
    inputs = layer_inputs(n, np.ones(n), edges, 2, 5.0)
    assert len(calls) == 1 and inputs[0] == 5.0 and len(inputs) == n
    held = [passthrough_bytes(first, first + 10, edges) for first in range(1, n - 10)]
    assert len(calls) <= 2, "at most one more validation for all the stage queries (none if cached before)"
    assert held[100] == _old_passthrough(101, 111, edges)


def _profile_head(n: int, edge_lines: list[str]) -> str:
    return "".join(edge_lines) + "layer,name\n" + "".join(f"{i},l{i}\n" for i in range(n))


def test_edge_readers_are_bounded_per_layer_at_the_line_that_passes_the_bound():
    n = 20
    limit = MAX_READERS_PER_LAYER * n
    per_line = 10  # distinct reader sets of layer 0's tensors, few enough lines for the line bound
    sets = itertools.islice(itertools.combinations(range(1, n), per_line), limit // per_line)
    lines = [f"# edge: 0->{','.join(map(str, readers))} 4\n" for readers in sets]
    assert len(lines) * per_line == limit and len(lines) <= MAX_EDGES_PER_LAYER * n
    assert len(read_edges(_profile_head(n, lines), n, "p.csv")) == len(lines)
    with pytest.raises(ProfileError, match=rf"^p\.csv:{len(lines) + 1}: {limit + 2} readers on the edge lines so far, more than {limit} for {n} layers"):
        read_edges(_profile_head(n, lines + ["# edge: 1->5,9 3\n"]), n, "p.csv")


def test_a_line_with_millions_of_readers_is_refused_before_they_are_split():
    line = "# edge: 0->" + ",x" * 2_000_000 + " 4\n"  # would be a list of 2 million strings
    with pytest.raises(ProfileError, match=r"^p\.csv:1: 2000001 readers on the edge lines so far") as info:
        read_edges(_profile_head(5, [line]), 5, "p.csv")
    assert info.value.hint and "\n" not in str(info.value.message)
