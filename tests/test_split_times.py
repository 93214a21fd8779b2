"""A profile's split backward (bwd_input_ms + bwd_weight_ms) must add up to its bwd_ms: two parts
that add up to less would make zero-bubble look faster than 1F1B by work that is not there."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.cli import one_error_line
from helpers.profiles import COLUMNS
from planner.errors import ProfileError
from planner.profiling.profile import read_profile_text


def _csv(rows: list[str], columns: str = ",bwd_input_ms,bwd_weight_ms") -> str:
    return "\n".join(["# format: pplan-profile/1", COLUMNS + columns, *rows]) + "\n"


# layer 1 at size 2: I 1.0 + W 1.0 = 2.0 against a whole backward of 6.0
SHORT = _csv(["0,a,1,1.0,2.0,100,10,4,1.0,1.0", "0,a,2,2.0,4.0,100,20,8,2.0,2.0",
              "1,b,1,1.5,3.0,50,12,4,1.5,1.5", "1,b,2,3.0,6.0,50,24,8,1.0,1.0"])


def test_parts_that_add_up_to_less_than_the_backward_are_refused():
    with pytest.raises(ProfileError) as e:
        read_profile_text(SHORT, "short.csv")
    text = str(e.value)
    assert "short.csv: layer 1 (b) at micro_batch_size 2: bwd_input_ms 1 + bwd_weight_ms 1 = 2, but bwd_ms is 6" in text
    assert "leave both columns out" in text


def test_parts_that_add_up_to_more_are_refused_unless_all_of_it_is_input():
    over = _csv(["0,a,1,1.0,2.0,100,10,4,1.5,1.5"])
    with pytest.raises(ProfileError, match="= 3, but bwd_ms is 2"):
        read_profile_text(over)
    noisy = read_profile_text(_csv(["0,a,1,1.0,2.0,100,10,4,2.2,0"]))  # I timed alone above B: what older profilers wrote
    assert noisy.columns["bwd_input_ms"].tolist() == [[2.2]] and noisy.columns["bwd_weight_ms"].tolist() == [[0.0]]


def test_one_part_given_is_completed_and_checked():
    given = read_profile_text(_csv(["0,a,1,1.0,2.0,100,10,4,0.5"], ",bwd_input_ms"))
    assert given.columns["bwd_weight_ms"].tolist() == [[1.5]]
    with pytest.raises(ProfileError, match="bwd_input_ms 0 \\+ bwd_weight_ms 3 = 3, but bwd_ms is 2"):
        read_profile_text(_csv(["0,a,1,1.0,2.0,100,10,4,3.0"], ",bwd_weight_ms"))
    halves = read_profile_text(_csv(["0,a,1,1.0,2.0,100,10,4"], ""))
    assert halves.columns["bwd_input_ms"].tolist() == halves.columns["bwd_weight_ms"].tolist() == [[1.0]]


def test_the_files_rounding_is_not_a_mismatch():
    # 6 significant digits, as pplan writes: 0.333333 + 1.66667 = 2.000003
    p = read_profile_text(_csv(["0,a,1,1.0,2.0,100,10,4,0.333333,1.66667"]))
    assert np.isclose(p.columns["bwd_input_ms"][0, 0] + p.columns["bwd_weight_ms"][0, 0], 2.0, rtol=1e-5)


def test_partition_refuses_such_a_profile_in_one_line(pplan, tmp_path):
    bad = tmp_path / "short.csv"
    bad.write_text(SHORT, encoding="utf-8")
    line = one_error_line(*pplan("partition", bad, "--devices", 2, "--global-batch", 8, "--out", tmp_path / "p.json")[::2])
    assert "bwd_ms is 6" in line and str(bad) in line
    assert not (tmp_path / "p.json").exists()
