"""`pplan run` of a data x pipeline plan: D replicas of the pipeline over a (dp, pp) DeviceMesh,
kept in sync by a gradient all-reduce over the mesh's dp group (multi-process tests are slow).

Equivalence: dp = 2 x pp = 2 of the GPT equals one process that accumulates each replica's
slice of the global batch and averages the two sums (planner.execute.reference), bit for bit:
same thread count, M = 4 and dp = 2 powers of two, and a 2-rank all-reduce is one addition.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from planner.errors import PplanError
from planner.execute import RunOptions
from planner.execute.checkpoint import latest_checkpoint, load_rank_file
from planner.execute.mesh import coords
from planner.execute.pipeline import replica_slice
from planner.execute.preflight import check_parallel
from planner.execute.reference import reference_run
from planner.execute.run import run_plan
from planner.plan import Plan, load_plan, plan_to_dict

from helpers.equivalence import EQUIVALENCE_THREADS, torch_threads
from helpers.meshruns import GPT, dp_plan, launch, run_options
from helpers.plans import write_synthetic_profile



def test_replica_slices():
    x = torch.arange(16).reshape(16, 1)
    parts = [replica_slice((x, [x]), d, 2) for d in range(2)]
    assert torch.equal(parts[0][0], x[:8]) and torch.equal(parts[1][1][0], x[8:])
    assert replica_slice(x, 0, 1) is x
    with pytest.raises(PplanError, match="does not split"):
        replica_slice(torch.zeros(5, 1), 0, 2)


def test_world_and_coordinates(tmp_path):
    plan = load_plan(dp_plan(tmp_path / "p.json", GPT, "1f1b", 2, [(0, 2), (2, 4)], n_microbatches=4))
    assert plan.n_processes == 4 and plan.global_batch == 2 * 2 * 4
    assert [coords(plan, r) for r in range(4)] == [(0, 0), (0, 1), (1, 0), (1, 1)]


@pytest.mark.parametrize("model,parallel,match", [
    # tensor parallelism runs on the built-in gpt only (tests/test_run_tp.py)
    ("mlp:layers=4,hidden=32,input=16,classes=8", {"dp": 1, "pp": 2, "tp": 2, "zero": 0}, "runs only on the built-in gpt"),
    (GPT, {"dp": 1, "pp": 2, "tp": 4, "zero": 0}, "tp 4 does not divide the gpt's 2 attention heads"),
    (GPT, {"dp": 2, "pp": 2, "tp": 2, "zero": 2}, "ZeRO stage 2 with tensor parallelism"),
    (GPT, {"dp": 2, "pp": 4, "tp": 1, "zero": 0}, "pp 4 is not its 2 pipeline devices"),
])
def test_layouts_the_executor_cannot_run_are_refused_before_starting(tmp_path, model, parallel, match):
    path = dp_plan(tmp_path / "p.json", model, "1f1b", 2, [(0, 2), (2, 4)], parallel=parallel)
    plan = load_plan(path)
    with pytest.raises(PplanError, match=match) as err:
        check_parallel(plan)
    assert "\n" not in err.value.one_line() and err.value.hint
    with pytest.raises(PplanError, match=match):  # run_plan refuses in preflight, before any process
        run_plan(plan, RunOptions(steps=1, device="cpu"), plan_path=str(path))


def test_pplan_run_refuses_tensor_parallelism_of_other_models_in_one_line(tmp_path):
    from helpers.cli import run_pplan

    path = dp_plan(tmp_path / "p.json", MLP, "1f1b", 2, [(0, 2), (2, 4)], parallel={"dp": 1, "pp": 2, "tp": 2, "zero": 0})
    res = run_pplan("run", str(path), "--device", "cpu", timeout=60)
    assert res.returncode == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert any("runs only on the built-in gpt" in ln and "tp=1" in ln for ln in lines), res.stderr
    assert "Traceback" not in res.stderr


def test_calibrate_with_dp_is_refused(tmp_path):
    plan = load_plan(dp_plan(tmp_path / "p.json", GPT, "1f1b", 2, [(0, 2), (2, 4)]))
    with pytest.raises(PplanError, match="--calibrate with data parallelism"):
        check_parallel(plan, RunOptions(steps=1, calibrate=True))


def _layers(root: Path, plan, ranks) -> dict[int, dict]:
    _, folder = latest_checkpoint(root, plan)
    out: dict[int, dict] = {}
    for r in ranks:
        out.update(load_rank_file(folder, r)["layers"])
    return out


MLP = "mlp:layers=4,hidden=32,input=16,classes=8"
DP_CASES = [
    # model, schedule, cuts, recompute, optimizer (SGD for the GPT: see test_run_equivalence)
    (GPT, "1f1b", [(0, 2), (2, 4)], {}, "sgd"),
    (GPT, "gpipe", [(0, 2), (2, 4)], {0: [1]}, "sgd"),
    (GPT, "interleaved", [(0, 1), (1, 2), (2, 3), (3, 4)], {}, "sgd"),  # two stages per rank
    (MLP, "zb", [(0, 2), (2, 4)], {1: [2]}, "adam"),  # split I/W backward, torch's CSV runtime
]


STEPS = 3


def _case_id(case: tuple) -> str:
    return f"{case[0].split(':')[0]}-{case[1]}"


@pytest.fixture(scope="module")
def dp_launched(tmp_path_factory) -> dict[str, tuple[Plan, list[dict], Path]]:
    """case id -> (plan, its 4 ranks' records, checkpoint folder): every DP_CASES plan trains 3
    steps in one launch of 4 processes (helpers.meshruns.launch: train_rank, what `pplan run`'s
    ranks run; starting 4 ranks and importing torch costs seconds each time).
    test_dp2_pp2_synthetic_on_four_processes runs a dp plan through `pplan run`'s whole path."""
    base = tmp_path_factory.mktemp("dp")
    plans = {_case_id(c): load_plan(dp_plan(base / f"{_case_id(c)}.json", c[0], c[1], 2, c[2], micro_batch_size=2,
                                            n_microbatches=4, recompute=c[3], optimizer=c[4], seed=3)) for c in DP_CASES}
    jobs = [{"plan": plan_to_dict(p), "options": run_options(base / f"ck-{k}", steps=STEPS)} for k, p in plans.items()]
    records = launch(jobs, 4, base / "launch")
    return {k: (p, recs, base / f"ck-{k}") for (k, p), recs in zip(plans.items(), records)}


@pytest.mark.slow
@pytest.mark.parametrize("case", [_case_id(c) for c in DP_CASES])
def test_dp2_pp2_equals_single_process_accumulation(dp_launched, case):
    plan, ranks, ck = dp_launched[case]
    with torch_threads(EQUIVALENCE_THREADS):
        ref_losses, ref_layers = reference_run(plan, STEPS, lr=1e-2)
    losses = ranks[1]["losses"]  # replica 0's last stage reports the step's mean over replicas
    assert [losses[str(k)] for k in range(STEPS)] == pytest.approx(ref_losses, rel=1e-12, abs=0)
    assert ref_losses[-1] != ref_losses[0]
    # the all-reduce was measured on every rank
    assert all(r["grad_allreduce_ms"] and min(r["grad_allreduce_ms"]) > 0 for r in ranks)
    for replica in (0, 1):  # both replicas hold the reference's weights, bit for bit
        got = _layers(ck, plan, [replica * 2, replica * 2 + 1])
        assert sorted(got) == sorted(ref_layers)
        for i, sd in ref_layers.items():
            for name, ref in sd.items():
                torch.testing.assert_close(got[i][name], ref, rtol=0, atol=0,
                                           msg=lambda m, i=i, n=name, d=replica: f"replica {d} layer {i} {n}: {m}")


@pytest.mark.slow
def test_dp2_pp2_synthetic_on_four_processes(tmp_path):
    prof = tmp_path / "syn.csv"
    spec = write_synthetic_profile(prof, 4, 2, fwd_ms=5.0, bwd_ms=10.0)
    path = dp_plan(tmp_path / "plan.json", spec, "1f1b", 2, [(0, 2), (2, 4)], micro_batch_size=2, n_microbatches=4,
                   profile=prof)
    plan = load_plan(path)
    outcome = run_plan(plan, RunOptions(steps=4, warmup=1, device="cpu", threads=1), plan_path=str(path),
                       use_machine=False)
    run = outcome.record.to_dict()
    assert run["n_ranks"] == 4 and run["dp"] == 2 and len(run["ranks"]) == 4
    assert [(r["rank"], r["replica"], r["device"]) for r in run["ranks"]] == [(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]
    assert run["loss_steps"] == [0, 1, 2, 3] and all(v is not None for v in run["losses"])
    # the run record's losses (gathered from the ranks, assembled) are one process's accumulation's
    with torch_threads(1):
        ref_losses, _ = reference_run(plan, 4, lr=RunOptions().lr)
    assert run["losses"] == pytest.approx(ref_losses, rel=1e-12, abs=0) and len(set(ref_losses)) > 1
    # the all-reduce was measured on every rank, and is part of the step
    assert run["grad_allreduce_ms_measured"] > 0 and all(r["grad_allreduce_ms"] > 0 for r in run["ranks"])
    assert run["grad_allreduce_ms_measured"] < run["iteration_ms_measured"]
    assert "one replica" in run["prediction_source"]
    # one pipeline (M + S - 1) x 3 x (f + b) per stage of two layers = 5 x 30 ms: replicas run side by side
    assert run["iteration_ms_predicted"] == pytest.approx(5 * 2 * 15.0, abs=1)
    assert run["iteration_ms_measured"] >= run["iteration_ms_predicted"] - 0.01
    # the timeline shows replica 0's pipeline: one row per F and B of each device
    fb = [r for r in outcome.timeline if r.kind in "FB"]
    assert len(fb) == 2 * 2 * 4


@pytest.mark.slow
def test_a_checkpoint_resumes_with_more_replicas(tmp_path):
    # replicas hold the same state after every step, so a replica added on resume starts from
    # replica 0's file: the run goes on in sync, and the save records its dp
    ck, common = tmp_path / "ck", (GPT, "1f1b", 2, [(0, 2), (2, 4)])
    kw = dict(micro_batch_size=2, n_microbatches=4, optimizer="sgd", seed=3)
    one = load_plan(dp_plan(tmp_path / "one.json", *common, parallel={"dp": 1, "pp": 2, "tp": 1, "zero": 0}, **kw))
    opts = dict(warmup=1, device="cpu", lr=1e-2, threads=EQUIVALENCE_THREADS, checkpoint_dir=str(ck))
    run_plan(one, RunOptions(steps=2, **opts), plan_path=str(tmp_path / "one.json"))
    two = load_plan(dp_plan(tmp_path / "two.json", *common, **kw))
    run = run_plan(two, RunOptions(steps=4, **opts), plan_path=str(tmp_path / "two.json")).record.to_dict()
    assert run["dp"] == 2 and run["first_step"] == 2
    step, folder = latest_checkpoint(ck, two)
    assert step == 4 and json.loads((folder / "COMPLETE.json").read_text())["dp"] == 2
    first, second = _layers(ck, two, [0, 1]), _layers(ck, two, [2, 3])
    for i, sd in first.items():
        for name, w in sd.items():
            torch.testing.assert_close(second[i][name], w, rtol=0, atol=0)
