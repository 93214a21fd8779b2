"""`--schedule` and `--microbatches` hold the data x pipeline x tensor search (plan_parallel and
`pplan partition --nodes`) as they hold the one-pipeline search; time limits are finite."""

import math
import re
from pathlib import Path

import pytest

from planner.errors import InfeasibleError, PplanError, ScheduleError
from planner.hardware import load_hardware
from planner.partition.parallel_plan import format_parallel
from planner.partition.parallel_search import plan_parallel
from planner.partition.parallel_sweep import layout_sweep
from planner.profiling.analytic import analytic_profile
from planner.schedules import check_sizes
from helpers.cli import one_error_line

SPEC = "gpt:layers=8,hidden=2048,heads=16,seq=1024,vocab=32000"
KW = dict(model=SPEC, hardware="a100-80gb", nodes=2, gpus_per_node=4, global_batch=64)
CLI_GPT = "gpt:layers=24,hidden=2048,heads=16,seq=2048,vocab=51200"
MLP = Path(__file__).resolve().parents[1] / "profiles" / "mlp.csv"


@pytest.fixture(scope="module")
def spec_profile():
    return analytic_profile(SPEC, load_hardware("a100-80gb"), "bfloat16", [1, 2, 4, 8])


@pytest.fixture
def analytic_csv(analytic_profile):
    return analytic_profile(CLI_GPT, "1,2,4,8")


def _suggested_counts(message: str) -> list[int]:
    """The micro-batch counts a refusal's hint says would run."""
    found = re.search(r"; --microbatches ([\d, ]+) would run", message)
    assert found, message
    return [int(x) for x in found.group(1).split(",")]


# ---- the library: plan_parallel(schedules=..., microbatches=...) ----

def test_held_schedule_and_count_hold_every_candidate_and_auto_is_never_slower(spec_profile):
    auto = plan_parallel(spec_profile, **KW)
    held = plan_parallel(spec_profile, schedules=("1f1b",), microbatches=8, **KW)
    assert {c.schedule for c in held.candidates} == {"1f1b"} and {c.n_microbatches for c in held.candidates} == {8}
    assert all(c.config.dp * c.micro_batch_size * 8 == 64 for c in held.candidates)
    assert auto.best.iteration_ms <= held.best.iteration_ms * (1 + 1e-12)
    assert held.held_to == "--schedule 1f1b --microbatches 8" and auto.held_to == ""
    assert format_parallel(held).splitlines()[0].endswith("; held to --schedule 1f1b --microbatches 8")
    assert "held to" not in format_parallel(auto)


def test_held_count_takes_the_size_it_implies_unless_sizes_are_given(spec_profile):
    # M = 16 of 64 samples: dp=1 runs b=4, dp=2 b=2, dp=4 b=1; b=4 was a searched size all along,
    # but with the sizes given as (2,) only dp=2 is left
    free = plan_parallel(spec_profile, microbatches=16, **KW)
    assert {c.config.dp * c.micro_batch_size for c in free.candidates} == {4}
    sized = plan_parallel(spec_profile, microbatches=16, micro_batch_sizes=(2,), **KW)
    assert {(c.config.dp, c.micro_batch_size) for c in sized.candidates} == {(2, 2)}


def test_a_count_no_layout_splits_is_refused_naming_counts_that_run(spec_profile):
    with pytest.raises(ScheduleError) as e:
        plan_parallel(spec_profile, microbatches=7, **KW)
    message = str(e.value)
    assert "--microbatches 7 cannot run on any dp x pp x tp layout of 8 GPUs" in message and "\n" not in message
    counts = _suggested_counts(message)
    assert 8 in counts and 7 not in counts
    for m in counts[:2]:  # the nearest ones do run
        assert plan_parallel(spec_profile, microbatches=m, **KW).best.n_microbatches == m


def test_a_count_the_schedule_refuses_names_torchs_rule_and_counts_it_takes(spec_profile):
    # zb on 8 ranks with 17 micro-batches: torch needs a multiple of its round count (17 // 8 = 2)
    kw = dict(KW, nodes=1, gpus_per_node=8, global_batch=17, parallel="pp=8")
    with pytest.raises(ScheduleError) as e:
        plan_parallel(spec_profile, schedules=("zb",), microbatches=17, **kw)
    message = str(e.value)
    assert "--schedule zb --microbatches 17 cannot run on --parallel dp=1,pp=8,tp=1" in message
    assert "round count" in message and message.endswith("would run with --schedule zb")
    counts = _suggested_counts(message)
    assert counts and 17 not in counts
    for m in counts:
        check_sizes("zb", 8, m)
        assert 17 % m == 0


def test_a_schedule_that_runs_on_no_layout_says_so(spec_profile):
    with pytest.raises(ScheduleError, match=r"interleaved needs at least 2 pipeline ranks.*runs nowhere on dp=8,pp=1,tp=1: "
                       r"choose another --schedule, or --parallel auto \(dp=\d+,pp=\d+,tp=1 runs it\)"):
        plan_parallel(spec_profile, schedules=("interleaved",), parallel="dp=8", **KW)


def test_held_flags_are_named_when_memory_is_what_fails(spec_profile):
    kw = dict(KW, memory_bytes=2 * 2**30, recompute="none")
    assert plan_parallel(spec_profile, **kw).best.fits  # 2 GiB is enough for the free search
    with pytest.raises(InfeasibleError, match=r"with every dp x pp x tp layout and --schedule gpipe --microbatches 64 --recompute none on 8 GPUs; "
                       r".*: use --schedule auto \("):
        plan_parallel(spec_profile, schedules=("gpipe",), microbatches=64, **kw)  # every micro-batch held at once


@pytest.mark.parametrize("count", [0, 4097, True, 2.5, math.inf])
def test_a_count_out_of_range_is_refused(spec_profile, count):
    with pytest.raises(PplanError, match=r"--microbatches must be a whole number from 1 to 4096"):
        plan_parallel(spec_profile, microbatches=count, **KW)


def test_a_held_count_past_the_profiled_sizes_warns(spec_profile):
    r = plan_parallel(spec_profile, microbatches=2, parallel="dp=2,pp=2,tp=2", **KW)  # 64 / (2 x 2) = 16 samples
    assert r.best.micro_batch_size == 16
    assert any("micro-batches of 16 samples, beyond the profile's largest (8)" in w for w in r.warnings)
    assert not plan_parallel(spec_profile, **KW).warnings


def test_layout_sweep_skips_layouts_that_cannot_split_the_batch_or_run_the_count(spec_profile):
    hw = load_hardware("a100-80gb")
    # 4 samples on 8 GPUs: the dp=8 layout cannot share them (this raised before)
    points = {(p.config.dp, p.config.pp, p.config.tp): p for p in
              layout_sweep(spec_profile, hardware=hw, nodes=2, gpus_per_node=4, global_batch=4)}
    assert points[(8, 1, 1)].tflops_per_gpu is None and points[(4, 2, 1)].tflops_per_gpu
    # held to 16 micro-batches of 64 samples, only dp <= 4 splits them
    held = layout_sweep(spec_profile, hardware=hw, nodes=2, gpus_per_node=4, global_batch=64, microbatches=16)
    assert {p.config.dp for p in held if p.tflops_per_gpu} == {1, 2, 4}
    assert all(p.tflops_per_gpu is None for p in held if p.config.dp == 8)


# ---- the command line ----

def test_partition_nodes_takes_schedule_and_microbatches(pplan, analytic_csv, tmp_path):
    from planner.plan import load_plan

    out = tmp_path / "plan.json"
    code, stdout, err = pplan("partition", analytic_csv, "--nodes", 2, "--hardware", "a100-80gb", "--global-batch", 256,
                              "--schedule", "1F1B", "--microbatches", 32, "--out", out)
    assert code == 0, err
    plan = load_plan(out)
    assert (plan.schedule, plan.n_microbatches, plan.global_batch) == ("1f1b", 32, 256)
    assert "held to --schedule 1f1b --microbatches 32" in stdout.splitlines()[0]


@pytest.mark.parametrize("flags,words", [
    (("--microbatches", "7"), "--microbatches 7 cannot run on any dp x pp x tp layout of 16 GPUs"),
    (("--schedule", "1f1b", "--microbatches", "2", "--parallel", "dp=2,pp=8"), "needs at least as many micro-batches as ranks"),
    (("--schedule", "interleaved", "--parallel", "dp=16"), "interleaved needs at least 2 pipeline ranks"),
    (("--schedule", "pipedream"), "--schedule: unknown schedule 'pipedream'"),
    (("--microbatches", "many"), "--microbatches 'many' is neither auto nor an integer"),
], ids=["count-no-layout-splits", "1f1b-too-few", "interleaved-one-rank", "unknown-schedule", "count-text"])
def test_partition_nodes_refuses_what_leaves_nothing_in_one_line(pplan, analytic_csv, tmp_path, flags, words):
    out = tmp_path / "plan.json"
    code, _, err = pplan("partition", analytic_csv, "--nodes", 2, "--hardware", "a100-80gb", "--global-batch", 256,
                         *flags, "--out", out)
    assert words in one_error_line(code, err) and not out.exists()


def test_partition_nodes_plot_with_a_held_count_draws_the_layouts(pplan, analytic_csv, tmp_path):
    out, png = tmp_path / "plan.json", tmp_path / "layouts.png"
    code, _, err = pplan("partition", analytic_csv, "--nodes", 1, "--hardware", "a100-40gb", "--memory", "20GiB",
                         "--global-batch", 64, "--microbatches", 16, "--out", out, "--plot", png)
    assert code == 0, err
    assert png.stat().st_size > 0


# ---- time limits: positive and finite ----

@pytest.mark.parametrize("value", ["inf", "nan", "-inf", "0"])
def test_partition_time_limit_must_be_finite_and_positive(pplan, tmp_path, value):
    out = tmp_path / "plan.json"
    code, _, err = pplan("partition", MLP, "--devices", 2, "--global-batch", 16, "--method", "ilp",
                         "--time-limit", value, "--out", out)
    assert "--time-limit must be positive and finite" in one_error_line(code, err) and not out.exists()


@pytest.mark.parametrize("value", ["inf", "nan", "0"])
def test_bench_planner_ilp_time_limit_must_be_finite_and_positive(pplan, tmp_path, value):
    code, _, err = pplan("bench", "planner", "--layers", "6", "--devices", "2", "--no-parallel",
                         "--ilp-time-limit", value, "--out-dir", tmp_path / "bench")
    assert "--ilp-time-limit must be positive and finite" in one_error_line(code, err)
    assert not (tmp_path / "bench").exists()


def test_options_read_the_cluster_schedule_and_count_and_a_finite_time_limit():
    from planner.partition.options import cluster_settings_from_options, settings_from_options

    s = cluster_settings_from_options(nodes=1, hardware="a100-80gb", global_batch=64, schedule=" ZB ", microbatches="16")
    assert (s.schedule, s.microbatches) == ("zb", 16)
    default = cluster_settings_from_options(nodes=1, hardware="a100-80gb", global_batch=64)
    assert (default.schedule, default.microbatches) == ("auto", None)
    with pytest.raises(ScheduleError, match="--schedule: unknown schedule"):
        cluster_settings_from_options(nodes=1, hardware="a100-80gb", global_batch=64, schedule="pipedream")
    with pytest.raises(PplanError, match="--time-limit must be positive and finite, got inf"):
        settings_from_options(devices=2, memory=None, global_batch=8, time_limit=math.inf)
