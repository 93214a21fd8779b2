"""--time-limit bounds the ILP only: given with a method that runs no ILP it is refused, and an ILP
that ran out of time is said to have, not reported as a memory problem (the exact DP, solved beside
it on every problem, shows that a plan fits)."""

from pathlib import Path

import pytest

import planner.partition.ilp
from planner.errors import InfeasibleError, PplanError
from planner.partition.api import partition
from planner.partition.options import settings_from_options
from planner.profiling.profile import load_profile
from helpers.cli import one_error_line

MLP = Path(__file__).resolve().parents[1] / "profiles" / "mlp.csv"


@pytest.mark.parametrize("method", [None, "dp", "uniform"])
def test_a_time_limit_for_a_search_without_the_ilp_is_refused(pplan, tmp_path, method):
    out = tmp_path / "plan.json"
    code, _, err = pplan("partition", MLP, "--devices", 2, "--global-batch", 16, "--time-limit", 5, "--out", out,
                         *(("--method", method) if method else ()))
    line = one_error_line(code, err)
    assert f"--time-limit 5 bounds the ILP, which --method {method or 'auto'} does not run" in line, line
    assert not out.exists()


def test_an_ilp_out_of_time_says_so_where_the_dp_found_a_plan(monkeypatch):
    monkeypatch.setattr(planner.partition.ilp, "solve_ilp", lambda p, time_limit: None)  # every solve times out
    prof = load_profile(MLP)
    with pytest.raises(PplanError, match=r"the ILP found no plan within --time-limit 7 s, though one fits \(the DP's: ") as e:
        partition(prof, settings_from_options(devices=2, memory=None, global_batch=16, method="ilp", time_limit=7))
    assert not isinstance(e.value, InfeasibleError)
    # where nothing fits at all, the memory advice stands
    with pytest.raises(InfeasibleError, match="no plan fits"):
        partition(prof, settings_from_options(devices=2, memory="1KiB", global_batch=16, method="ilp", time_limit=7))
