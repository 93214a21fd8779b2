"""Report figure 3 (the micro-batch sweep) for a data-parallel plan: M counts one replica's micro-batches,
each of b = global batch / (dp x M) samples, as `pplan simulate --sweep microbatches=...` simulates them;
points whose b lies outside the profiled sizes (extrapolated) are drawn apart from measured ones."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from planner.report import fig_sweep, load_inputs
from planner.report.derive import derive, sweep_counts
from planner.report.style import style_context

GPT = "gpt:layers=4,hidden=256,heads=4,seq=128,vocab=1000"
# dp 4 x pp 2 on one node of 8, global batch 32: a replica's batch is 8, so M = 1, 2, 4, 8 run micro-batches
# of 8, 4, 2, 1; profiled at 1 and 4, b = 8 is extrapolated, 2 interpolated, 4 and 1 measured.
COUNTS = [1, 2, 4, 8]


def _dp4_plan(pplan, folder: Path, sizes: str) -> tuple[Path, Path]:
    """(plan, profile) of a dp=4, pp=2 plan of a small analytic GPT profiled at `sizes`."""
    profile, plan = folder / "gpt.csv", folder / "plan.json"
    code, _, err = pplan("profile", "--analytic", "--model", GPT, "--hardware", "a100-80gb", "--dtype", "bfloat16",
                         "-b", sizes, "-o", profile)
    assert code == 0, err
    code, _, err = pplan("partition", profile, "--nodes", 1, "--gpus-per-node", 8, "--hardware", "a100-80gb",
                         "--global-batch", 32, "--parallel", "dp=4,pp=2,tp=1", "-o", plan)
    assert code == 0, err
    return plan, profile


@pytest.fixture
def dp4(pplan, tmp_path: Path) -> tuple[Path, Path]:
    return _dp4_plan(pplan, tmp_path, "1,4")


def test_caption_and_axis_say_the_batch_splits_over_replicas(dp4):
    plan, profile = dp4
    inputs = load_inputs(profile=profile, plan=plan)
    assert inputs.plan.dp == 4 and inputs.plan.global_batch == 32
    text = fig_sweep.caption(inputs)
    assert "M micro-batches per replica of b = 8 / M samples" in text
    assert "global batch stays 32 = dp 4 x M x b" in text
    assert "32 / M" not in text  # the global batch is not what one micro-batch splits
    derived = derive(inputs)
    with style_context():
        fig = fig_sweep.draw(derived.inputs, derived)
    for ax in fig.axes:
        assert ax.get_xlabel() == "micro-batches per replica M (global batch 32 = dp 4 x M x b)"
        assert [t.get_text() for t in ax.get_xticklabels()] == [f"{m}\nb={8 // m}" for m in COUNTS]


def test_one_pipeline_keeps_the_plain_split():
    plan = SimpleNamespace(dp=1, global_batch=8, n_microbatches=4, micro_batch_size=2, n_devices=2)
    assert fig_sweep.x_label(plan) == "micro-batches per iteration M (global batch 8 = M x b)"


def test_swept_counts_divide_a_replicas_batch():
    # dp 4, a replica's batch 720: the global batch's divisors (2,880 has 36) thinned to 12 kept powers of
    # two up to 2,048, most of which a replica of 720 samples cannot split into
    plan = SimpleNamespace(n_microbatches=720, micro_batch_size=1, n_devices=4, dp=4)
    counts = sweep_counts(plan)
    assert len(counts) == 12 and all(720 % m == 0 for m in counts)
    assert 1 in counts and 720 in counts and 4 in counts


def _simulate_sweep(pplan, plan: Path, schedule: str) -> tuple[dict[int, dict], set[int]]:
    """`pplan simulate PLAN --schedule ... --sweep microbatches=1,2,4,8`: its rows by M (JSON) and the Ms its
    table marks "(size extrapolated)"."""
    args = ("simulate", plan, "--schedule", schedule, "--sweep", "microbatches=" + ",".join(map(str, COUNTS)))
    code, out, err = pplan(*args, "--json")
    assert code == 0, err
    rows = {r["n_microbatches"]: r for r in json.loads(out)["rows"] if r["error"] is None}
    code, table, err = pplan(*args)
    assert code == 0, err
    flagged = {int(m) for m in re.findall(r"^\s*\S+\s+(\d+)\s.*\(size extrapolated\)$", table, re.M)}
    return rows, flagged


def test_derived_points_are_the_simulate_sweeps_and_extrapolated_ones_are_flagged(dp4, pplan):
    plan, profile = dp4
    inputs = load_inputs(profile=profile, plan=plan)
    derived = derive(inputs)
    points = derived.sweep
    assert {p.n_microbatches for p in points} == set(COUNTS)
    for schedule in sorted({p.schedule for p in points}):
        rows, flagged = _simulate_sweep(pplan, plan, schedule)
        mine = {p.n_microbatches: p for p in points if p.schedule == schedule}
        assert set(mine) == set(rows), schedule
        for m, p in mine.items():
            row = rows[m]
            assert p.micro_batch_size == row["micro_batch_size"] == 8 // m
            assert p.iteration_ms == pytest.approx(row["iteration_ms"], rel=1e-9)
            assert p.bubble_fraction == pytest.approx(row["bubble_fraction"], rel=1e-9)
            assert p.fits == row["fits"]
        assert flagged == {m for m in mine if m == 1}, schedule  # b = 8 only: b = 2 is interpolated
    assert fig_sweep.extrapolated_counts(COUNTS, inputs.plan, inputs.profile) == [1]
    assert "extrapolated from the nearest profiled size" in fig_sweep.caption(inputs)
    with style_context():
        fig = fig_sweep.draw(derived.inputs, derived)
    for ax in fig.axes:
        grey = {(int(line.get_xdata()[0]), line.get_color()) for line in ax.get_lines()
                if len(line.get_xdata()) == 1 and line.get_markerfacecolor() == fig_sweep.EXTRAPOLATED_FACE}
        assert {x for x, _ in grey} == {1}  # every schedule's point at M=1, and no other
        assert len(ax.patches) == 1  # the grey band behind M=1
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "b extrapolated (beyond profiled b 1 to 4)" in legend


def test_no_band_or_note_when_every_size_is_profiled(pplan, tmp_path: Path):
    plan, profile = _dp4_plan(pplan, tmp_path, "1,2,4,8")
    inputs = load_inputs(profile=profile, plan=plan)
    derived = derive(inputs)
    assert "extrapolated" not in fig_sweep.caption(inputs)
    with style_context():
        fig = fig_sweep.draw(derived.inputs, derived)
    assert not fig.axes[0].patches
    assert not any("extrapolated" in t.get_text() for t in fig.axes[0].get_legend().get_texts())


def test_rows_that_cannot_run_count_every_replica_and_leave_unknown_sizes_out(dp4, pplan):
    # dp 4 x pp 2, global batch 32: interleaved cannot run on 2 stages of 2 devices, and 3 micro-batches
    # cannot split a replica's batch of 8; the first row once showed the replica's 8 as the global batch,
    # the second a size and global batch of 0
    plan, _ = dp4
    code, out, err = pplan("simulate", plan, "--sweep", "schedule=1f1b,interleaved", "--json")
    assert code == 0, err
    rows = {r["value"]: r for r in json.loads(out)["rows"]}
    assert rows["interleaved"]["error"] and rows["interleaved"]["global_batch"] == rows["1f1b"]["global_batch"] == 32
    code, out, err = pplan("simulate", plan, "--sweep", "microbatches=2,3", "--json")
    assert code == 0, err
    rows = {r["value"]: r for r in json.loads(out)["rows"]}
    assert rows[2]["global_batch"] == 32 and rows[2]["micro_batch_size"] == 4
    assert rows[3]["error"] and rows[3]["micro_batch_size"] is None and rows[3]["global_batch"] is None
