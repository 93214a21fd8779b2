"""`pplan bench`'s list and count options are bounded before any cell runs: layers by what a
profile may hold, devices by what a pipeline may have, a planner cell by what its tables hold,
list lengths, simulator sizes by the simulator's action bound, quality's global batch; and a
planner table whose ILP finished no cell still gets its note. Commands run in this process
(conftest's `pplan`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.cli import one_error_line
from planner.errors import PplanError
from planner.limits import MAX_BENCH_LIST, MAX_BENCH_PLANNER_CELL, MAX_GLOBAL_BATCH, MAX_SIMULATED_ACTIONS
from planner.plan.records import MAX_PIPELINE_STAGES
from planner.profiling.profile import MAX_LAYERS


@pytest.mark.parametrize("args, says", [
    (["planner", "--layers", str(MAX_LAYERS + 1), "--devices", "2"], f"--layers {MAX_LAYERS + 1} is outside 1..{MAX_LAYERS:,}"),
    (["planner", "--layers", "1000000000", "--devices", "2"], f"1..{MAX_LAYERS:,}"),
    (["planner", "--layers", "50", "--devices", str(MAX_PIPELINE_STAGES + 1)], f"1..{MAX_PIPELINE_STAGES:,}"),
    (["planner", "--layers", ",".join(str(n) for n in range(2, MAX_BENCH_LIST + 3)), "--devices", "2"],
     f"{MAX_BENCH_LIST + 1} values, more than {MAX_BENCH_LIST}"),
    (["planner", "--layers", "4000", "--devices", "4,64"], "--layers 4000 x --devices 64 is 1,024,000,000 layers^2 x devices"),
    (["simulator", "--sizes", "64x100000"], f"19,200,000 actions to simulate, beyond the simulator's bound of {MAX_SIMULATED_ACTIONS:,}"),
    (["simulator", "--sizes", "8x64,8x64"], "repeats a size"),
    (["simulator", "--sizes", "8x64,8x30"],  # once refused only after gpipe and 1f1b had been timed
     "--sizes 8x30 under interleaved: schedule interleaved needs the micro-batch count to be a multiple"),
    (["simulator", "--sizes", ",".join(f"2x{m}" for m in range(1, MAX_BENCH_LIST + 2))], f"more than {MAX_BENCH_LIST}"),
    (["quality", "--devices", str(MAX_PIPELINE_STAGES + 1)], f"1..{MAX_PIPELINE_STAGES:,}"),
    (["quality", "--global-batch", str(MAX_GLOBAL_BATCH + 1)], f"1..{MAX_GLOBAL_BATCH:,}"),
])
def test_bench_refuses_counts_beyond_what_pplan_plans(tmp_path: Path, pplan, args: list[str], says: str) -> None:
    out = tmp_path / "bench"
    code, _out, err = pplan("bench", *args, *(["--no-parallel"] if args[0] == "planner" else []), "--out-dir", out)
    line = one_error_line(code, err)
    assert says in line, line
    assert not out.exists()


def test_the_simulator_bench_bound_is_the_simulators(tmp_path: Path, pplan) -> None:
    most = MAX_SIMULATED_ACTIONS // (3 * 8)  # zb: 3 actions per micro-batch and stage
    line = one_error_line(*pplan("bench", "simulator", "--sizes", f"8x{most + 1}", "--out-dir", tmp_path / "b")[::2])
    assert f"{3 * 8 * (most + 1):,} actions" in line and f"use at most {most:,} micro-batches with 8 stages" in line


def test_the_planner_bench_checks_its_counts_as_a_library_call() -> None:
    from planner.bench import bench_planner
    from planner.bench.planner_bench import check_counts

    assert check_counts([200, 50, 50], "--layers", MAX_LAYERS, "50") == [50, 200]
    assert check_counts([MAX_LAYERS], "--layers", MAX_LAYERS, "50") == [MAX_LAYERS]
    with pytest.raises(PplanError, match=f"outside 1..{MAX_LAYERS:,}"):
        bench_planner(layers=[10 ** 9], devices=[2])
    with pytest.raises(PplanError, match=f"outside 1..{MAX_PIPELINE_STAGES:,}"):
        bench_planner(layers=[10], devices=[MAX_PIPELINE_STAGES + 1])
    with pytest.raises(PplanError, match=f"use at most {MAX_BENCH_PLANNER_CELL // 1000 ** 2} devices"):
        bench_planner(layers=[1000], devices=[MAX_BENCH_PLANNER_CELL // 1000 ** 2 + 1])
    # a cell with more devices than layers does not run, so it is not bounded either
    assert [(r[0], r[1]) for r in bench_planner(layers=[6], devices=[2, MAX_PIPELINE_STAGES], ilp_time_limit=60).rows] == [(6, 2)]


def test_a_planner_table_where_the_ilp_finished_no_cell_says_so(monkeypatch) -> None:
    import planner.partition.ilp
    from planner.bench import bench_planner

    monkeypatch.setattr(planner.partition.ilp, "solve_ilp", lambda p, time_limit: None)  # every solve times out
    t = bench_planner(layers=[6], devices=[2], ilp_time_limit=1.0)
    assert [dict(zip(t.columns, r))["ilp_status"] for r in t.rows] == ["time limit"]
    assert "ILP finished no cell; it hit the limit at 6x2." in t.notes
    assert t.summary["ilp_practical_up_to"] is None and t.summary["ilp_first_limit"] == "6x2"
