"""Data x pipeline x tensor planning through the CLI: analytic profile -> partition --nodes -> plan JSON."""

import json
import re

import pytest

from planner.plan import load_plan, plan_from_dict, plan_to_json

GPT = "gpt:layers=24,hidden=2048,heads=16,seq=2048,vocab=51200"


@pytest.fixture
def analytic_csv(analytic_profile):
    return analytic_profile(GPT, "1,2,4,8")


def test_partition_nodes_writes_a_plan_with_its_parallel_layout(pplan, analytic_csv, tmp_path):
    out = tmp_path / "plan.json"
    code, stdout, err = pplan("partition", analytic_csv, "--nodes", 2, "--gpus-per-node", 8, "--hardware", "a100-80gb",
                              "--global-batch", 256, "--parallel", "dp=4,pp=2,tp=2", "--out", out)
    assert code == 0, err
    plan = load_plan(out)
    assert (plan.parallel.dp, plan.parallel.pp, plan.parallel.tp) == (4, 2, 2)
    assert plan.n_devices == 2 and plan.global_batch == 256  # dp x micro-batch size x micro-batches
    assert plan.predicted.tflops_per_gpu > 0 and 0 < plan.predicted.mfu < 1
    assert plan.stages[0].layers[0] == 0 and plan.stages[-1].layers[1] == plan.n_layers
    assert "TFLOP/s/GPU" in stdout and "dp=4,pp=2,tp=2" in stdout
    assert plan_to_json(plan_from_dict(json.loads(out.read_text()))) == out.read_text()  # round trip


def test_simulate_reproduces_a_parallel_plans_prediction(pplan, analytic_csv, tmp_path):
    out, timeline = tmp_path / "plan.json", tmp_path / "timeline.csv"
    assert pplan("partition", analytic_csv, "--nodes", 2, "--hardware", "a100-80gb", "--global-batch", 64,
                 "--parallel", "dp=2,pp=4,tp=2", "--out", out)[0] == 0
    plan = load_plan(out)
    assert (plan.parallel.gpus_per_node, plan.parallel.hardware) == (8, "a100-80gb")
    code, stdout, err = pplan("simulate", out, "--json", "--timeline", timeline)
    assert code == 0, err
    sim = json.loads(stdout)
    for key in ("iteration_ms", "tokens_per_s", "tflops_per_gpu", "mfu", "grad_sync_ms", "tp_comm_ms"):
        assert sim[key] == pytest.approx(getattr(plan.predicted, key), rel=1e-12), key
    kinds = {line.split(",")[2] for line in timeline.read_text().splitlines()[1:]}
    assert {"T", "A", "F", "O"} <= kinds and kinds & {"B", "I"}  # tensor-parallel collectives and the gradient sync are on it
    code, stdout, _ = pplan("simulate", out)
    assert code == 0 and "TFLOP/s per GPU" in stdout and "dp=2,pp=4,tp=2" in stdout


def test_too_little_memory_names_what_would_fit_and_writes_nothing(pplan, analytic_csv, tmp_path):
    out = tmp_path / "plan.json"
    code, _, err = pplan("partition", analytic_csv, "--nodes", 1, "--hardware", "a100-40gb", "--memory", "4GiB",
                         "--parallel", "dp=8", "--global-batch", 512, "--out", out)
    # 1.3B parameters over 8 replicas: even ZeRO-3 leaves 3.75 bytes each (4.9 GB), so no stage is offered
    assert code == 2 and "GPUs" in err and "--zero" not in err
    assert len(err.strip().splitlines()) == 1 and not out.exists()
    code, _, err = pplan("partition", analytic_csv, "--nodes", 1, "--hardware", "a100-40gb", "--memory", "8GiB",
                         "--parallel", "dp=8", "--global-batch", 512, "--out", out)
    # ZeRO-1: 5.5 bytes a parameter, 7.2 GB; offered with the plan a search with it found
    assert code == 2 and re.search(r", or --zero 1 \(dp=8,pp=1,tp=1,zero=1 \S+, M=\d+, recompute \w+\)$", err.strip())
    assert not out.exists()


def test_nodes_without_hardware_is_one_line(pplan, analytic_csv, tmp_path):
    code, _, err = pplan("partition", analytic_csv, "--nodes", 2, "--global-batch", 64, "--out", tmp_path / "p.json")
    assert code == 2 and "--hardware" in err


def test_plan_without_parallel_has_no_parallel_key(pplan, analytic_csv, tmp_path):
    out = tmp_path / "plan.json"
    assert pplan("partition", analytic_csv, "--devices", 2, "--global-batch", 16, "--out", out)[0] == 0
    assert "parallel" not in json.loads(out.read_text()) and load_plan(out).parallel is None


@pytest.mark.parametrize("flags,words", [
    (["--hardware", "no-such-gpu"], "no-such-gpu"),
    (["--hardware", "a100-40gb", "--memory", "lots"], "--memory"),
    (["--hardware", "a100-40gb", "--parallel", "dp=3"], "dp=3"),
])
def test_bad_cluster_option_is_one_line_and_writes_nothing(pplan, analytic_csv, tmp_path, flags, words):
    out = tmp_path / "plan.json"
    code, _, err = pplan("partition", analytic_csv, "--nodes", 1, "--global-batch", 64, *flags, "--out", out)
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1 and not out.exists()


def test_cluster_job_makes_the_commands_plan_and_sweeps_layouts_only_when_asked(pplan, analytic_csv, tmp_path):
    from planner.partition.job import partition_cluster
    from planner.partition.options import cluster_settings_from_options

    out = tmp_path / "plan.json"
    assert pplan("partition", analytic_csv, "--nodes", 1, "--hardware", "a100-40gb", "--memory", "20GiB",
                 "--global-batch", 64, "--recompute", "all", "--out", out)[0] == 0
    settings = cluster_settings_from_options(nodes=1, hardware="a100-40gb", global_batch=64, memory="20GiB", recompute="all")
    assert settings.recompute == "full" and settings.memory_bytes == 20 * 2**30 and settings.hardware.name == "a100-40gb"
    plain = partition_cluster(analytic_csv, settings)
    assert plan_to_json(plain.plan) == out.read_text() and plain.layouts == ()
    swept = partition_cluster(analytic_csv, settings, layouts=True)
    assert swept.plan == plain.plan and {p.config.gpus for p in swept.layouts} == {8} and len(swept.layouts) > 1
    assert swept.layouts_title.endswith(f"global batch 64, chosen {plain.result.best.config.describe()}")
    # progress: one step as each pipeline DP starts (its point named), then the total once the bound settles the rest
    steps: list[tuple[int, int, str]] = []
    counted = partition_cluster(analytic_csv, settings, on_step=lambda done, total, note: steps.append((done, total, note)))
    assert counted.plan == plain.plan
    total = steps[0][1]
    assert {s[1] for s in steps} == {total} and steps[-1] == (total, total, "")
    assert [s[0] for s in steps[:-1]] == list(range(plain.result.solved)) and plain.result.solved <= total
    assert all(re.match(r"dp=\d+,pp=\d+,tp=\d+ b=\d+ \w+$", note) for _, _, note in steps[:-1]), steps[:3]


def test_nodes_plot_draws_every_layout_with_the_chosen_one(pplan, analytic_csv, tmp_path):
    import matplotlib.image as mpimg

    out, png = tmp_path / "plan.json", tmp_path / "layouts.png"
    code, _, err = pplan("partition", analytic_csv, "--nodes", 1, "--hardware", "a100-40gb", "--memory", "20GiB",
                         "--global-batch", 64, "--out", out, "--plot", png)
    assert code == 0, err
    img = mpimg.imread(png)
    assert img.shape[0] > 300 and img.shape[1] > 600
    drawn = (img[..., :3] < 0.9).any(axis=-1).mean()  # share of non-white pixels: markers, axes, labels
    assert 0.01 < drawn < 0.5


def test_layout_sweep_marks_layouts_that_do_not_fit(analytic_csv):
    from planner.hardware import load_hardware
    from planner.partition.parallel_sweep import layout_sweep
    from planner.profiling.profile import load_profile

    points = layout_sweep(load_profile(analytic_csv), hardware=load_hardware("a100-40gb"), nodes=1, gpus_per_node=8,
                          global_batch=64, memory_bytes=20 * 2**30)
    layouts = {(p.config.dp, p.config.pp, p.config.tp) for p in points}
    assert (8, 1, 1) in layouts and (1, 1, 8) in layouts and all(p.config.gpus == 8 for p in points)
    assert any(p.fits for p in points) and any(not p.fits and p.tflops_per_gpu for p in points)
