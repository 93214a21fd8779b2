"""What `pplan run` refuses before starting any process (exit code 2, one line)."""

from __future__ import annotations

import pytest

from planner.errors import PlanError, PplanError, ScheduleError
from planner.execute import RunOptions
from planner.execute.checkpoint import finish_save, prepare_save, save_rank_file
from planner.execute.preflight import cpu_rank_cap, preflight
from planner.execute.run import run_plan
from planner.plan import load_plan

from helpers.cli import run_pplan
from helpers.plans import write_plan, write_synthetic_profile

CPU = RunOptions(device="cpu", steps=4)


def test_a_plan_with_another_layer_count_than_its_model_is_refused(tmp_path):
    plan = load_plan(write_plan(tmp_path / "p.json", "mlp:layers=5", "1f1b", 2, [(0, 2), (2, 4)]))
    with pytest.raises(PlanError, match="cover 4 layers but model 'mlp:layers=5' has 5"):
        preflight(plan, CPU)


def test_a_changed_profile_is_refused_unless_forced(tmp_path):
    prof = tmp_path / "syn.csv"
    spec = write_synthetic_profile(prof, 4, 2)
    plan = load_plan(write_plan(tmp_path / "p.json", spec, "1f1b", 2, [(0, 2), (2, 4)], profile=prof))
    assert preflight(plan, CPU).profile.n_layers == 4
    prof.write_text(prof.read_text().replace(",10.0,20.0,", ",11.0,20.0,"))
    with pytest.raises(PlanError, match="changed since the plan was made"):
        preflight(plan, CPU)
    assert preflight(plan, CPU, force=True).profile is not None


def test_another_profile_given_with_profile_is_run_with_a_warning(tmp_path):
    prof = tmp_path / "syn.csv"
    spec = write_synthetic_profile(prof, 4, 2)
    plan = load_plan(write_plan(tmp_path / "p.json", spec, "1f1b", 2, [(0, 2), (2, 4)], profile=prof))
    assert preflight(plan, CPU, profile_override=str(prof)).warnings == ()  # the plan's own file, named
    other = tmp_path / "other.csv"
    other.write_text(prof.read_text().replace(",10.0,20.0,", ",11.0,20.0,"))
    pf = preflight(plan, CPU, profile_override=str(other))
    assert pf.profile.path == str(other)
    assert len(pf.warnings) == 1 and "predicted with --profile" in pf.warnings[0] and "other.csv" in pf.warnings[0]


def test_a_profile_of_another_model_is_refused(tmp_path):
    prof = tmp_path / "syn.csv"
    write_synthetic_profile(prof, 6, 2)
    plan = load_plan(write_plan(tmp_path / "p.json", "synthetic:layers=4", "1f1b", 2, [(0, 2), (2, 4)]))
    with pytest.raises(PlanError, match="has 6 layers"):
        preflight(plan, CPU, profile_override=str(prof))


def test_too_many_cpu_ranks_are_refused_unless_forced(tmp_path):
    n = cpu_rank_cap() + 1
    plan = load_plan(write_plan(tmp_path / "p.json", f"synthetic:layers={n}", "gpipe", n, [(i, i + 1) for i in range(n)]))
    with pytest.raises(PplanError, match=f"asks for {n} CPU ranks"):
        preflight(plan, CPU)
    assert preflight(plan, CPU, force=True).device_type == "cpu"


def test_cuda_without_a_gpu_is_refused(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    plan = load_plan(write_plan(tmp_path / "p.json", "mlp:layers=4", "1f1b", 2, [(0, 2), (2, 4)]))
    with pytest.raises(PplanError, match="no usable CUDA device"):
        preflight(plan, RunOptions(device="cuda"))
    assert preflight(plan, RunOptions(device="auto")).device_type == "cpu"


def test_the_launcher_checks_a_cpu_plan_without_importing_torch(tmp_path):
    """`pplan run`'s own process leaves torch to the ranks on a machine without GPU device nodes:
    importing it there cost seconds before any rank started (a 1-step 2-rank run: 6.2 s -> 4.4 s)."""
    import subprocess
    import sys

    from planner.execute.preflight import no_gpu_device_nodes

    if not no_gpu_device_nodes():
        pytest.skip("this machine may have a GPU: --device auto asks torch")
    path = write_plan(tmp_path / "p.json", "mlp:layers=4", "1f1b", 2, [(0, 2), (2, 4)])
    code = ("import sys; from planner.execute import RunOptions; from planner.execute.preflight import preflight; "
            f"from planner.plan import load_plan; pf = preflight(load_plan({str(path)!r}), RunOptions(device='auto')); "
            "print(pf.device_type, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["cpu", "False"], out.stderr


def test_sizes_torch_cannot_run_are_refused(tmp_path):
    plan = load_plan(write_plan(tmp_path / "p.json", "mlp:layers=4", "1f1b", 2, [(0, 2), (2, 4)], n_microbatches=1))
    with pytest.raises(ScheduleError, match="at least as many micro-batches as ranks"):
        preflight(plan, CPU)


def test_a_checkpoint_already_at_the_step_count_is_refused(tmp_path):
    plan = load_plan(write_plan(tmp_path / "p.json", "mlp:layers=4", "1f1b", 2, [(0, 2), (2, 4)]))
    prepare_save(tmp_path / "ck", 4)
    for r in range(2):
        save_rank_file(tmp_path / "ck", 4, r, {})
    finish_save(tmp_path / "ck", 4, plan, 2)
    with pytest.raises(PplanError, match="already at step 4 >= --steps 4"):
        preflight(plan, RunOptions(device="cpu", steps=4, checkpoint_dir=str(tmp_path / "ck")))
    with pytest.raises(PplanError, match="leaves 2 step"):  # both of them warm-up (the default 2)
        preflight(plan, RunOptions(device="cpu", steps=6, checkpoint_dir=str(tmp_path / "ck")))
    assert preflight(plan, RunOptions(device="cpu", steps=7, checkpoint_dir=str(tmp_path / "ck"))).resume_step == 4


def test_calibrate_without_a_profile_is_refused_before_launch(tmp_path):
    plan = load_plan(write_plan(tmp_path / "p.json", "mlp:layers=4", "1f1b", 2, [(0, 2), (2, 4)]))
    with pytest.raises(PplanError, match="--calibrate needs the plan's profile"):
        run_plan(plan, RunOptions(device="cpu", calibrate=True))


@pytest.mark.parametrize("bad", [{"steps": 0}, {"warmup": -1}, {"lr": 0.0}, {"device": "tpu"},
                                 {"checkpoint_every": 2}, {"timeout_s": 0}])
def test_run_options_are_validated(bad):
    with pytest.raises(PplanError):
        RunOptions(**bad)


def test_cli_refuses_a_mismatched_plan_with_exit_code_2_and_one_line(tmp_path):
    path = write_plan(tmp_path / "p.json", "mlp:layers=6", "1f1b", 2, [(0, 2), (2, 4)])
    res = run_pplan("run", str(path), "--device", "cpu")  # the timeout only guards against a hang
    assert res.returncode == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("pplan: error:")]
    assert len(lines) == 1 and "cover 4 layers" in lines[0]
    assert "step 1/" not in res.stderr  # no rank ever started: refused before launch, not after


def _factory_profile(tmp_path, **recorded: str):
    """A profile of a 4-layer factory model measured with `recorded` (input_shape, input_dtype, vocab)."""
    from planner.profiling.profile import load_profile

    prof = tmp_path / "fac.csv"
    write_synthetic_profile(prof, 4, 2)
    lines = prof.read_text().splitlines(keepends=True)
    prof.write_text(lines[0] + "".join(f"# {k}: {v}\n" for k, v in recorded.items()) + "".join(lines[1:]))
    return prof, load_profile(prof)


@pytest.mark.parametrize("flag, given, recorded", [("input_shape", (16,), "--input-shape 8"),
                                                   ("input_dtype", "float", "--input-dtype long"),
                                                   ("vocab", 300, "--vocab 200")])
def test_a_flag_that_differs_from_the_profiled_input_is_refused(tmp_path, flag, given, recorded):
    from planner.execute.preflight import model_kwargs

    prof, profile = _factory_profile(tmp_path, input_shape="8", input_dtype="long", vocab="200")
    with pytest.raises(PlanError) as e:
        model_kwargs(profile, RunOptions(device="cpu", **{flag: given}))
    shown = ",".join(map(str, given)) if isinstance(given, tuple) else str(given)
    assert f"--{flag.replace('_', '-')} {shown} differs from the {recorded}" in e.value.message
    assert str(prof) in e.value.message and f"profile the model with --{flag.replace('_', '-')} {shown}" in e.value.hint
    # the recorded value itself, and a flag for what the profile does not record, are used
    _, lacking = _factory_profile(tmp_path, input_shape="8", input_dtype="float")
    got = model_kwargs(lacking, RunOptions(device="cpu", input_shape=(8,), vocab=50))
    assert got == {"input_shape": (8,), "input_dtype": "float", "vocab": 50}


def test_run_refuses_another_input_shape_than_the_profiles_in_one_line(tmp_path, pplan):
    prof, _ = _factory_profile(tmp_path, input_shape="32", input_dtype="long", vocab="200")
    plan = write_plan(tmp_path / "p.json", "byo_lm:build", "1f1b", 2, [(0, 2), (2, 4)], profile=prof)
    code, _, err = pplan("run", str(plan), "--device", "cpu", "--model", "byo_lm:build", "--input-shape", "128")
    assert code == 2 and err.count("pplan: error:") == 1 and "Traceback" not in err
    assert "--input-shape 128 differs from the --input-shape 32" in err


def test_a_schedule_too_large_to_simulate_is_refused_before_it_is_built(tmp_path):
    # building the action lists of 10**6 micro-batches took 1.45 GB and 20 s before the prediction refused them
    plan = load_plan(write_plan(tmp_path / "p.json", "synthetic:layers=4", "1f1b", 2, [(0, 2), (2, 4)],
                                micro_batch_size=1, n_microbatches=1_000_000))
    with pytest.raises(ScheduleError, match="1000000 micro-batches is 4,000,000 actions"):
        preflight(plan, CPU)
