"""The profile's `# edge:` lines: writing, reading, round trips, and one-line errors with line numbers."""

from __future__ import annotations

import pytest

from planner.errors import ProfileError
from planner.graph import SkipEdge, add_edge_lines, as_skip_edges, edge_lines, read_edges
from planner.profiling.profile import read_profile_text

from helpers.graphs import CHAIN, UNET_EDGES


def test_lines_are_sorted_and_list_every_consumer():
    assert edge_lines(reversed(UNET_EDGES)) == ["# edge: 0->1,7 4096", "# edge: 2->3,5 2048"]
    assert edge_lines([(3, 6, 10)]) == ["# edge: 3->6 10"]
    assert edge_lines([]) == []


def test_round_trip_through_a_profile_and_the_profile_still_loads():
    text = add_edge_lines(CHAIN, UNET_EDGES)
    lines = text.splitlines()
    assert lines[3:5] == ["# edge: 0->1,7 4096", "# edge: 2->3,5 2048"]  # after the metadata, before the header
    assert read_edges(text, n_layers=10) == UNET_EDGES
    assert read_profile_text(text).n_layers == 10  # today's reader skips them as metadata
    assert add_edge_lines(text, [(0, 9, 1)]).count("# edge:") == 1  # rewriting replaces them


def test_a_chain_profile_stays_byte_for_byte_the_same():
    assert add_edge_lines(CHAIN, []) == CHAIN
    assert add_edge_lines(add_edge_lines(CHAIN, UNET_EDGES), ()) == CHAIN
    assert read_edges(CHAIN, 10) == ()


def test_traced_unet_edges_round_trip():
    from planner.graph import trace_layers
    from unet_model import build

    model = build()
    lg = trace_layers(model, model.make_batch(2, 0)[0])
    text = add_edge_lines(CHAIN, lg.skip_edges)
    assert read_edges(text, lg.n_layers) == lg.skip_edges == UNET_EDGES


def _with(line: str) -> str:
    return CHAIN.replace("# input_bytes_per_sample: 3072\n", f"# input_bytes_per_sample: 3072\n{line}\n")


@pytest.mark.parametrize("line, message", [
    ("# edge: 5->5 10", r"<profile>:4: edge '5->5 10': source layer 5 >= destination layer 5"),
    ("# edge: 7->2 10", r"<profile>:4: edge '7->2 10': source layer 7 >= destination layer 2"),
    ("# edge: 0->10 10", r"<profile>:4: .*destination layer 10 is out of range \(the profile has layers 0..9\)"),
    ("# edge: -1->3 10", r"<profile>:4: .*source layer -1 is negative"),
    ("# edge: 0->3 -5", r"<profile>:4: .*bytes_per_sample -5.0 is negative"),
    ("# edge: 0->3 nan", r"<profile>:4: .*not finite"),
    ("# edge: 0->3 1.5", r"<profile>:4: .*not a whole number"),
    ("# edge: 0->3 lots", r"<profile>:4: .*'lots' is not a number"),
    ("# edge: 0->1 10", r"<profile>:4: .*0->1 is the chain edge; count it in output_bytes of layer 0"),
    ("# edge: 0->5,3 10", r"<profile>:4: .*must be ascending"),
    ("# edge: 0->a 10", r"<profile>:4: .*layers must be integers"),
    ("# edge: 0 to 3", r"<profile>:4: .*does not read as <src>-><dst>"),
])
def test_bad_edge_lines_are_refused_with_their_line(line, message):
    with pytest.raises(ProfileError, match=message) as e:
        read_edges(_with(line), n_layers=10)
    assert "\n" not in str(e.value)


def test_a_repeated_edge_names_both_lines():
    text = _with("# edge: 0->3 10\n# edge: 0->3 20")
    with pytest.raises(ProfileError, match=r"x.csv:5: .*repeats 0->3 \(first on line 4\); add the bytes into one line"):
        read_edges(text, 10, source="x.csv")
    assert len(read_edges(_with("# edge: 0->3 10\n# edge: 0->2,3 20"), 10)) == 2  # other consumers: another tensor


def test_edges_after_the_header_are_not_metadata():
    assert read_edges(CHAIN + "# edge: 0->3 10\n", 10) == ()


def test_as_skip_edges_checks_tuples():
    assert as_skip_edges([(2, 5, 7.0, [4, 3])]) == (SkipEdge(2, 5, 7, (3, 4)),)
    with pytest.raises(ProfileError, match="not \\(src, dst"):
        as_skip_edges([(1, 2)])
