"""What a user sees of a data/tensor-parallel run says its layout: `pplan run`'s summary (the layout,
each rank's replica and tp rank, the gradient all-reduce), the report's plan line (layout and
processes), figure 6's rank labels, and memory figures that stay readable when the peaks are MiB
under a 12 GiB limit (the `cpu` preset). A one-pipeline run prints exactly as before."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli.cmd_run import print_run
from planner.execute.runrecord import RankRecord, RunRecord
from planner.hardware import load_hardware
from planner.parallel import ParallelConfig
from planner.plan import load_plan
from planner.report import fig_accuracy, fig_memory
from planner.report.inputs import ReportInputs, parse_sim
from planner.report.layout import RunLayout, run_layout
from planner.report.style import MEMORY_PARTS, style_context
from planner.report.summary import plan_line
from planner.simulation.replica import Cluster, replica_layout

MIB = 1 << 20
CPU_LIMIT = 12 << 30  # the cpu preset's memory per device
PLAN = Path(__file__).parent / "data" / "sim_plan.json"


def _run(dp: int = 1, pp: int = 2, tp: int = 1, limit: int | None = CPU_LIMIT, peak: int = 3 * MIB) -> RunRecord:
    """A run of dp x pp x tp ranks numbered as planner.execute.mesh numbers them, one stage per device."""
    ranks = []
    for rank in range(dp * pp * tp):
        replica, device = divmod(rank // tp, pp)
        ranks.append(RankRecord(rank=rank, device=device, host="h", stages=[device], busy_ms=10.0 + rank,
                                busy_ms_predicted=9.0, peak_memory_bytes_measured=peak + rank,
                                peak_memory_bytes_predicted=peak, memory_limit_bytes=limit,
                                memory_measure="cpu-allocator", replica=replica,
                                grad_allreduce_ms=2.0 if dp > 1 else None))
    return RunRecord(plan="plan.json", model="gpt", schedule="1f1b", runtime="Schedule1F1B", device_type="cpu",
                     n_ranks=len(ranks), n_stages=pp, micro_batch_size=2, n_microbatches=4, optimizer="adam",
                     steps=3, warmup=1, iteration_ms_measured=50.0, iteration_ms_predicted=40.0, error_pct=-20.0,
                     prediction_source="simulate(profile)", losses=[5.0, 4.0], loss_steps=[0, 2],
                     step_ms=[60.0, 50.0, 50.0], measured_steps=[1, 2], timeline_step=2, ranks=ranks, dp=dp,
                     grad_allreduce_ms_measured=2.0 if dp > 1 else None,
                     grad_allreduce_ms_predicted=1.25 if dp > 1 else None)


def _printed(capsys, run: RunRecord, zero: int = 0) -> list[str]:
    print_run(run, out=None, timeline=None, zero=zero)
    return capsys.readouterr().out.splitlines()


def test_one_pipeline_prints_as_it_always_has(capsys):
    assert _printed(capsys, _run()) == [
        "ran plan.json: 1f1b, 2 rank(s), 2 stage(s), 4 x 2 samples, steps 1-3 on cpu (Schedule1F1B)",
        "iteration: measured 50.0 ms (median of 2 step(s)), predicted 40.0 ms [simulate(profile)], error -20.0%",
        "rank  device  stages         busy  busy pred    peak mem   predicted  measure",
        "   0       0  0           10.0 ms   9.000 ms     3.0 MiB     3.0 MiB  cpu-allocator",
        "   1       1  1           11.0 ms   9.000 ms     3.0 MiB     3.0 MiB  cpu-allocator",
        "loss: 5.000000 (step 1) -> 4.000000 (step 3)",
    ]


def test_a_dp_tp_run_says_its_layout_replicas_tp_ranks_and_all_reduce(capsys):
    lines = _printed(capsys, _run(dp=2, pp=1, tp=2), zero=1)
    assert lines[0].startswith("ran plan.json: 1f1b, layout dp=2,pp=1,tp=2,zero=1, 4 rank(s), 1 stage(s), "
                               "4 x 2 samples per replica,")
    assert lines[2] == "gradient all-reduce: measured 2.000 ms, predicted 1.250 ms (inside the iteration)"
    header = lines[3].split()
    assert header[:5] == ["rank", "replica", "device", "tp", "rank"]
    rows = [line.split()[:4] for line in lines[4:8]]
    # (rank, replica, device, tp rank): every rank apart, as planner.execute.mesh numbers them
    assert rows == [["0", "0", "0", "0"], ["1", "0", "0", "1"], ["2", "1", "0", "0"], ["3", "1", "0", "1"]]


def test_tensor_parallelism_alone_has_a_tp_column_and_no_all_reduce(capsys):
    lines = _printed(capsys, _run(pp=2, tp=2))
    assert "layout dp=1,pp=2,tp=2, 4 rank(s)" in lines[0] and "per replica" not in lines[0]
    assert not any(line.startswith("gradient") for line in lines)
    assert lines[2].split()[:4] == ["rank", "device", "tp", "rank"]
    assert [line.split()[:3] for line in lines[3:7]] == [["0", "0", "0"], ["1", "0", "1"], ["2", "1", "0"],
                                                         ["3", "1", "1"]]


def test_zero_2_times_the_reduce_scatter(capsys):
    lines = _printed(capsys, _run(dp=2, pp=2), zero=2)
    assert "layout dp=2,pp=2,tp=1,zero=2," in lines[0]
    assert lines[2].startswith("gradient reduce-scatter: measured 2.000 ms")
    assert lines[3].split()[:3] == ["rank", "replica", "device"] and "tp" not in lines[3].split()


def test_the_layout_is_read_from_the_run_alone():
    assert run_layout(_run(dp=2, pp=2, tp=2)) == RunLayout(dp=2, pp=2, tp=2)
    layout = run_layout(_run(dp=2, pp=1, tp=2))
    assert (layout.dp, layout.pp, layout.tp) == (2, 1, 2) and [layout.tp_rank(r) for r in range(4)] == [0, 1, 0, 1]
    assert run_layout(_run()).one_pipeline
    edited = _run(dp=2, pp=1, tp=2).with_(n_ranks=3)  # a count that does not divide: no tp ranks made up
    assert run_layout(edited).tp == 1


def test_the_report_plan_line_says_the_layout_and_the_processes():
    plan = load_plan(PLAN)
    assert plan_line(plan).startswith("1f1b, 8 micro-batches of 4 (global batch 32) on 3 devices; layers")
    line = plan_line(plan.with_(parallel=ParallelConfig(dp=2, pp=3, tp=2, zero=1)))
    assert line.startswith("1f1b, 8 micro-batches of 4 per replica (global batch 64), "
                           "layout dp=2,pp=3,tp=2,zero=1 on 12 processes; layers")
    tp_only = plan_line(plan.with_(parallel=ParallelConfig(dp=1, pp=3, tp=2)))
    assert "(global batch 32), layout dp=1,pp=3,tp=2 on 6 processes;" in tp_only and "devices" not in tp_only


def test_figure_6_labels_every_rank_apart():
    labels = fig_accuracy.rank_labels(ReportInputs(run=_run(dp=2, pp=1, tp=2)))
    assert labels == ["dev 0\nr0 tp0", "dev 0\nr0 tp1", "dev 0\nr1 tp0", "dev 0\nr1 tp1"]
    assert fig_accuracy.rank_labels(ReportInputs(run=_run(pp=2, tp=2))) == ["dev 0\ntp0", "dev 0\ntp1",
                                                                             "dev 1\ntp0", "dev 1\ntp1"]
    assert fig_accuracy.rank_labels(ReportInputs(run=_run())) == ["dev 0", "dev 1"]


def _limit_lines(ax) -> list:
    return [a for a in [*ax.lines, *ax.collections] if a.get_label() == "memory limit"]


def test_figure_6_scales_to_mib_peaks_under_a_gib_limit_and_names_the_limit():
    import matplotlib.pyplot as plt

    with style_context():
        far = fig_accuracy.draw(ReportInputs(run=_run(dp=2, pp=2)))
        near = fig_accuracy.draw(ReportInputs(run=_run(dp=2, pp=2, limit=4 * MIB)))
    try:
        ax = next(a for a in far.axes if a.get_title() == "Peak memory per device")
        assert ax.get_ylabel() == "peak memory (MiB)" and ax.get_ylim()[1] < 20  # the bars, not 12 GiB, set the scale
        assert not _limit_lines(ax)
        assert "limit 12.0 GiB, not drawn: every peak is under 5% of it" in [t.get_text() for t in ax.texts]
        ax_near = next(a for a in near.axes if a.get_title() == "Peak memory per device")
        assert _limit_lines(ax_near)  # a limit near the peaks is drawn as before
        assert not any("not drawn" in t.get_text() for t in ax_near.texts)
    finally:
        plt.close(far)
        plt.close(near)
    assert "title names the limit" in fig_accuracy.caption(ReportInputs(run=_run(dp=2, pp=2)))


def _sim(peak: int, limit: int) -> ReportInputs:
    part = peak // 5
    devices = [{"device": s, "name": f"gpu{s}", "busy_ms": 10.0, "idle_ms": 1.0, "peak_memory_bytes": 5 * part,
                "memory": {**{p: part for p in MEMORY_PARTS}, "total": 5 * part}, "memory_limit_bytes": limit}
               for s in range(2)]
    sim = {"iteration_ms": 11.0, "bubble_fraction": 0.1, "throughput_samples_per_s": 100.0, "schedule": "1f1b",
           "n_microbatches": 4, "micro_batch_size": 1, "interpolated": False, "devices": devices,
           "memory_timeline": {str(s): [[0.0, 3 * part], [5.0, 5 * part], [9.0, 3 * part]] for s in range(2)}}
    return ReportInputs(sim=parse_sim(sim))


def test_figure_2_scales_to_mib_peaks_under_a_gib_limit_and_names_the_limit():
    import matplotlib.pyplot as plt

    with style_context():
        far = fig_memory.draw(_sim(3 * MIB, CPU_LIMIT))
        near = fig_memory.draw(_sim(3 * MIB, 4 * MIB))
    try:
        for ax in far.axes:  # peaks by kind, and memory over time
            assert "(MiB)" in ax.get_ylabel() and ax.get_ylim()[1] < 20
            assert not _limit_lines(ax)
            assert "limit 12.0 GiB, not drawn: every peak is under 5% of it" in [t.get_text() for t in ax.texts]
        assert "<1% of limit" in [t.get_text().split("\n")[-1] for t in far.axes[0].texts]
        assert all(_limit_lines(ax) for ax in near.axes)
    finally:
        plt.close(far)
        plt.close(near)
    assert "titles name the limit" in fig_memory.caption(_sim(3 * MIB, CPU_LIMIT))
    assert "the dashed line is the device's memory limit" in fig_memory.caption(_sim(3 * MIB, 4 * MIB))


@pytest.mark.parametrize("values, limits, drawn", [
    ([3 * MIB, float("nan")], [CPU_LIMIT, None], False),  # far under: named, not drawn
    ([0.05 * CPU_LIMIT], [CPU_LIMIT], True),  # at 5%: drawn
    ([3 * MIB], [None, 0], True),  # no limit to name
    ([float("nan")], [CPU_LIMIT], True),  # no peak known: the limit is all there is to show
])
def test_off_scale_only_when_every_peak_is_far_under_the_smallest_limit(values, limits, drawn):
    assert (fig_memory.off_scale_limit(values, limits) is None) == drawn


def test_one_gpu_per_pipeline_device_is_named_a_gpu_not_a_tp_group():
    hw = load_hardware("cpu")
    names = {tp: [d.name for d in replica_layout(ParallelConfig(dp=2, pp=2, tp=tp, gpus_per_node=2), hw.memory_bytes,
                                                 Cluster(hw, 2))[0]] for tp in (1, 2)}
    assert names == {1: ["gpu0", "gpu1"], 2: ["tp-group0", "tp-group1"]}
