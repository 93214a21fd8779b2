"""What `pplan run` compares a data x pipeline x tensor plan's measured step with: `pplan simulate`'s
prediction for the plan (one replica on its hardware preset, with the tp split, its collectives
and the gradient sync), each rank's expected action times (a tp rank's share), and the gradient
all-reduce each rank really does (all of its stages at once, planner.execute.pipeline).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.calibration import Calibration, calibration_path_for, write_calibration
from planner.execute.calibrate import compute_points, rank_grad_allreduce_ms
from planner.execute.preflight import Preflight
from planner.execute.prediction import predict
from planner.hardware import load_hardware
from planner.plan import Plan, load_plan, plan_from_dict, plan_to_dict
from planner.profiling.profile import Profile, load_profile
from planner.simulate import simulate

TINY = "gpt:layers=4,hidden=64,heads=4,seq=32,vocab=256"


def _tiny(pplan, folder: Path, parallel: str) -> tuple[Path, Path]:
    """The reviewer's tiny case: an analytic float32 profile on the cpu preset and the plan of
    `parallel` on one node of 4, global batch 8 (as `pplan partition --nodes` writes it)."""
    prof, plan = folder / "tiny.csv", folder / "plan.json"
    if not prof.exists():
        code, _, err = pplan("profile", "--analytic", "--hardware", "cpu", "--dtype", "float32", "-m", TINY,
                             "-b", "1,2,4", "-o", prof)
        assert code == 0, err
    code, _, err = pplan("partition", prof, "--nodes", "1", "--gpus-per-node", "4", "--hardware", "cpu",
                         "--global-batch", "8", "--parallel", parallel, "-o", plan)
    assert code == 0, err
    return prof, plan


def _preflight(profile: Profile) -> Preflight:
    return Preflight(n_layers=profile.n_layers, profile=profile, device_type="cpu", model_kwargs={}, resume_step=0)


def test_the_run_predicts_a_dp_tp_plan_as_simulate_does_and_ignores_a_calibration(pplan, tmp_path):
    prof_path, plan_path = _tiny(pplan, tmp_path, "dp=2,pp=1,tp=2")
    plan, prof = load_plan(plan_path), load_profile(prof_path)
    # a calibration fits one pipeline of whole layers: simulate leaves it out for such a plan, so must the run
    write_calibration(Calibration(compute_scale=3.0, action_overhead_ms=1.0), calibration_path_for(prof_path))
    prof = load_profile(prof_path)
    want = simulate(plan, prof, record_timeline=False)
    got, source, cal = predict(plan, _preflight(prof), use_machine=False)
    assert cal is None and source == "simulate(profile), dp=2,pp=1,tp=2 on cpu"
    assert got.iteration_ms == pytest.approx(want.iteration_ms, rel=1e-12)
    # per GPU: the tp rank's half of each block, not the whole pipeline's weights
    assert [d.peak_memory_bytes for d in got.devices] == [int(b) for b in want.peak_memory_bytes]
    whole = simulate(plan.with_(parallel=None), prof, record_timeline=False)
    assert got.devices[0].peak_memory_bytes < whole.peak_memory_bytes[0]
    assert got.grad_sync_ms == pytest.approx(want.replica.grad_sync_ms) and got.grad_sync_ms > 0


def test_a_dp_plan_without_a_hardware_preset_predicts_one_replica_of_whole_layers_and_says_so(pplan, tmp_path):
    prof_path, plan_path = _tiny(pplan, tmp_path, "dp=2,pp=2,tp=1")
    data = plan_to_dict(load_plan(plan_path))
    data["parallel"].pop("hardware")
    data["parallel"].pop("hardware_spec")  # the values it was planned on price it as well as a preset's name
    data["predicted"] = None
    plan, prof = plan_from_dict(data), load_profile(prof_path)
    got, source, _ = predict(plan, _preflight(prof), use_machine=False)
    assert source.startswith("simulate(profile), one replica of whole layers") and "no hardware preset" in source
    assert got.iteration_ms == pytest.approx(simulate(plan.with_(parallel=None), prof).iteration_ms, rel=1e-12)
    assert rank_grad_allreduce_ms(plan, prof) is None  # no link to price it on


def _interleaved(plan: Plan) -> Plan:
    """`plan` (pp = 2 over the tiny gpt's 6 layers) as interleaved: 4 stages, two per rank."""
    data = plan_to_dict(plan)
    data.update(schedule="interleaved", predicted=None, stages=[
        {"device": d, "layers": list(layers), "recompute": []}
        for d, layers in ((0, (0, 2)), (1, (2, 3)), (0, (3, 4)), (1, (4, 6)))])
    return plan_from_dict(data)


def test_a_rank_all_reduces_the_gradients_of_all_its_stages_at_once(pplan, tmp_path):
    prof_path, plan_path = _tiny(pplan, tmp_path, "dp=2,pp=2,tp=1")
    plan, prof = _interleaved(load_plan(plan_path)), load_profile(prof_path)
    # the oracle: one ring all-reduce over the 2 replicas of each rank's float32 gradients (as
    # many bytes as its parameters) on the cpu preset's in-node link; the slowest rank's
    params = prof.at(plan.micro_batch_size).param_bytes
    per_rank = [sum(float(params[i]) for st in plan.stages if st.device == d for i in range(*st.layers)) for d in (0, 1)]
    hw = load_hardware("cpu")
    bw, lat = hw.intra_node_bandwidth_bytes_per_s, hw.intra_node_latency_ms
    want = max(2 * lat + 2 * (1 / 2) * b / bw * 1e3 for b in per_rank)
    got = rank_grad_allreduce_ms(plan, prof)
    assert got == pytest.approx(want, rel=1e-9)
    # more than either of its stages alone would take (the figure the run once took from the plan)
    alone = max(2 * lat + b / bw * 1e3 for st in plan.stages for b in [sum(float(params[i]) for i in range(*st.layers))])
    assert got > alone


def test_a_tp_ranks_actions_are_compared_with_its_share_of_the_layers(pplan, tmp_path):
    prof_path, plan_path = _tiny(pplan, tmp_path, "dp=2,pp=1,tp=2")
    plan, prof = load_plan(plan_path), load_profile(prof_path)
    points = {label: profiled for profiled, _, label in compute_points([([0], {"0F": 1.0, "0B": 1.0})], plan, prof)}
    # what simulate puts on the timeline for the same actions: a tp rank's half of each block, its
    # box followed by the collectives' T row (the action ends when they do)
    sim, whole = _action_ms(simulate(plan, prof).timeline), _action_ms(simulate(plan.with_(parallel=None), prof).timeline)
    assert points["0F"] == pytest.approx(sim["F"], rel=1e-9) and points["0B"] == pytest.approx(sim["B"], rel=1e-9)
    assert points["0F"] != pytest.approx(whole["F"], rel=1e-3)  # not the whole layers' time


def _action_ms(rows: list) -> dict[str, float]:
    """kind -> duration of micro-batch 0's F and B on stage 0, up to the end of the T row that follows."""
    out = {}
    for kind in "FB":
        box = next(r for r in rows if r.kind == kind and r.stage == 0 and r.microbatch == 0)
        tail = [r.end_ms for r in rows if r.kind == "T" and r.stage == 0 and r.start_ms == box.end_ms]
        out[kind] = max([box.end_ms, *tail]) - box.start_ms
    return out


def test_calibrate_refuses_a_zero_plan_before_any_rank_starts(pplan, tmp_path):
    from planner.errors import PplanError
    from planner.execute import RunOptions
    from planner.execute.run import run_plan

    _, plan_path = _tiny(pplan, tmp_path, "dp=2,pp=2,tp=1")
    data = plan_to_dict(load_plan(plan_path))
    data["parallel"].update(dp=1, zero=1)  # passes the executor's checks (dp 1, tp 1), yet simulates as a replica
    data.pop("global_batch", None)  # derived: half of it with one replica
    plan = plan_from_dict(data)
    with pytest.raises(PplanError, match="cannot be fitted on a plan with parallel dp=1,pp=2,tp=1,zero=1") as err:
        run_plan(plan, RunOptions(steps=1, device="cpu", calibrate=True), plan_path=str(plan_path), use_machine=False)
    assert "\n" not in err.value.one_line() and err.value.hint


@pytest.mark.slow
def test_pplan_run_of_a_dp_tp_plan_reports_simulates_prediction_per_rank(pplan, run_cli, tmp_path):
    prof_path, plan_path = _tiny(pplan, tmp_path, "dp=2,pp=1,tp=2")
    out = tmp_path / "run.json"
    res = run_cli("run", plan_path, "--steps", "2", "--warmup", "1", "--device", "cpu", "--threads", "1", "-o", out)
    assert res.returncode == 0, res.stderr
    assert f"running {plan_path}: 4 rank(s)" in res.stderr  # dp x pp x tp processes, not the 1 pipeline device
    run = json.loads(out.read_text())
    plan, prof = load_plan(plan_path), load_profile(prof_path)
    sim = simulate(plan, prof, record_timeline=False)
    assert run["n_ranks"] == 4 and len(run["ranks"]) == 4
    assert run["iteration_ms_predicted"] == pytest.approx(sim.iteration_ms, rel=1e-12)
    assert run["prediction_source"] == "simulate(profile), dp=2,pp=1,tp=2 on cpu"
    assert [r["peak_memory_bytes_predicted"] for r in run["ranks"]] == [int(sim.peak_memory_bytes[0])] * 4
    assert run["grad_allreduce_ms_predicted"] == pytest.approx(rank_grad_allreduce_ms(plan, prof), rel=1e-12)
    assert run["grad_allreduce_ms_measured"] > 0
    # a calibration fits one pipeline: fitting one on this run is refused in one line, not by the simulator's hint
    res = run_cli("calibrate", plan_path, "--from-run", out)
    assert res.returncode == 2 and "cannot be fitted on a plan with parallel dp=2,pp=1,tp=2" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.slow
def test_a_synthetic_runs_actions_are_compared_in_wall_time_only(pplan, tmp_path):
    """The synthetic model's layers sleep: their CPU time says nothing of them, and a run once warned
    "0.19x in CPU time: the computation itself ran slower or faster than profiled"."""
    profile = tmp_path / "syn.csv"
    profile.write_bytes((Path(__file__).resolve().parents[1] / "profiles" / "synthetic-compute-imbalanced.csv").read_bytes())
    code, _, err = pplan("partition", profile, "--devices", 2, "--global-batch", 4, "--schedule", "gpipe",
                         "--microbatches", 2, "-o", tmp_path / "plan.json")
    assert code == 0, err
    code, _, err = pplan("run", tmp_path / "plan.json", "--steps", 3, "--threads", 1, "--out", tmp_path / "run.json")
    assert code == 0, err
    record = json.loads((tmp_path / "run.json").read_text())
    assert record["compute_ratio"] is not None and record["compute_ratio_cpu"] is None
    assert "in CPU time" not in err
