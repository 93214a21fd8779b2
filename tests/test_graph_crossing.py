"""crossing_bytes, passthrough_bytes, direct_send_bytes: hand examples and a brute-force oracle."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.errors import PplanError
from planner.graph import SkipEdge, crossing_bytes, direct_send_bytes, layer_input_bytes, passthrough_bytes, stage_ranges

# A 6-layer model: 0 -> 1 -> ... -> 5 chain, tensor A (layer 0) read by 1 and 4, B (2) read by 5.
OUT = [0, 10, 20, 30, 40, 50]  # chain bytes; layer 0 sends A only, which is a skip
EDGES = [SkipEdge(0, 4, 100, (1,)), SkipEdge(2, 5, 7)]


def test_crossing_is_chain_plus_every_skip_in_flight():
    assert crossing_bytes(6, OUT, EDGES).tolist() == [100, 110, 127, 137, 47]
    assert crossing_bytes(6, np.array(OUT) * 3, EDGES, micro_batch_size=3).tolist() == [300, 330, 381, 411, 141]
    assert crossing_bytes(6, OUT, [(0, 4, 100), (2, 5, 7)]).tolist() == [100, 110, 127, 137, 47]  # plain tuples


def test_a_chain_crosses_its_output_bytes():
    assert crossing_bytes(4, [5, 6, 7, 8]).tolist() == [5, 6, 7]
    assert crossing_bytes(1, [9]).tolist() == []


def test_passthrough_counts_only_tensors_the_stage_forwards_without_reading():
    assert passthrough_bytes(2, 4, EDGES) == 100   # A passes 2, 3; B is made inside
    assert passthrough_bytes(1, 3, EDGES) == 0     # A is read by layer 1
    assert passthrough_bytes(3, 4, EDGES) == 107   # A and B both pass layer 3
    assert passthrough_bytes(3, 5, EDGES) == 7     # A ends at 4, inside
    assert passthrough_bytes(3, 4, EDGES, micro_batch_size=2) == 214
    assert passthrough_bytes(0, 6, EDGES) == 0


def test_layer_inputs_are_the_previous_chain_plus_skips_read_there():
    assert [layer_input_bytes(i, OUT, EDGES) for i in range(1, 6)] == [100, 10, 20, 130, 47]
    assert layer_input_bytes(4, OUT, EDGES, micro_batch_size=2) == 30 + 200  # output bytes are per micro-batch already
    assert layer_input_bytes(2, [5, 6, 7]) == 6  # a chain: the layer before's output
    with pytest.raises(PplanError, match="no earlier layer"):
        layer_input_bytes(0, OUT, EDGES)


def test_direct_sends_go_from_producer_stage_to_each_reader_stage_once():
    sends = direct_send_bytes(6, [1, 3], OUT, EDGES)  # stages [0,2) [2,4) [4,6)
    assert sends.tolist() == [[0, 10, 100], [0, 0, 37], [0, 0, 0]]
    # Hop by hop the same cuts carry more: A crosses both.
    assert crossing_bytes(6, OUT, EDGES)[[1, 3]].tolist() == [110, 137]
    assert direct_send_bytes(6, [], OUT, EDGES).tolist() == [[0]]


def test_stage_ranges_and_bad_inputs():
    assert stage_ranges(5, [1, 3]) == [(0, 2), (2, 4), (4, 5)]
    for cuts in ([3, 1], [1, 1], [4], [-1]):
        with pytest.raises(PplanError, match="cuts"):
            stage_ranges(5, cuts)
    with pytest.raises(PplanError, match="shape"):
        crossing_bytes(5, [1, 2, 3])
    with pytest.raises(PplanError, match="past the last layer"):
        crossing_bytes(3, [1, 2, 3], [(0, 3, 5)])
    with pytest.raises(PplanError, match="source layer 2 >= destination layer 2"):
        crossing_bytes(3, [1, 2, 3], [(2, 2, 5)])
    with pytest.raises(PplanError, match="negative"):
        crossing_bytes(3, [1, 2, 3], [(0, 2, -1)])
    with pytest.raises(PplanError, match="empty"):
        passthrough_bytes(2, 2, EDGES)


# ---- brute force: tensors with a producer and a set of consumers ----------------------------

@st.composite
def _tensors(draw):
    n = draw(st.integers(2, 9))
    tensors = []
    for _ in range(draw(st.integers(0, 12))):
        p = draw(st.integers(0, n - 2))
        cons = draw(st.sets(st.integers(p + 1, n - 1), min_size=1, max_size=4))
        tensors.append((p, tuple(sorted(cons)), draw(st.integers(0, 1000))))
    cuts = sorted(draw(st.sets(st.integers(0, n - 2), max_size=n - 1)))
    return n, tensors, cuts


def _profile_form(n, tensors):
    """What trace_layers writes: chain bytes for tensors read by the next layer alone, else edges."""
    out, merged = [0] * n, {}
    for p, cons, b in tensors:
        if cons == (p + 1,):
            out[p] += b
        else:
            merged[(p, cons)] = merged.get((p, cons), 0) + b
    return out, [SkipEdge(p, c[-1], b, c[:-1]) for (p, c), b in merged.items()]


@settings(max_examples=300, deadline=None)
@given(_tensors())
def test_against_brute_force(case):
    n, tensors, cuts = case
    out, edges = _profile_form(n, tensors)
    want = [sum(b for p, cons, b in tensors if p <= c < max(cons)) for c in range(n - 1)]
    assert crossing_bytes(n, out, edges).tolist() == want
    ranges = stage_ranges(n, cuts)
    stage = {layer: s for s, (f, e) in enumerate(ranges) for layer in range(f, e)}
    direct = np.zeros((len(ranges), len(ranges)))
    for p, cons, b in tensors:
        for t in {stage[c] for c in cons} - {stage[p]}:
            direct[stage[p], t] += b
    assert np.array_equal(direct_send_bytes(n, cuts, out, edges), direct)
    for layer in range(1, n):
        reads = sum(b for p, cons, b in tensors if layer in cons)
        assert layer_input_bytes(layer, out, edges) == reads
    for first, end in ranges:
        through = sum(b for p, cons, b in tensors if p < first and max(cons) >= end and not any(first <= c < end for c in cons))
        assert passthrough_bytes(first, end, edges) == through
    # Hop by hop never sends less in total than direct sends do.
    assert sum(want[c] for c in cuts) >= direct.sum()
