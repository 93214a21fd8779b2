"""`pplan run` on a non-chain model: the U-Net's stages split by torch's pipeline() at the
planned cuts (skip tensors relayed stage to stage) train exactly like one process with
gradient accumulation (multi-process, slow)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from planner.errors import PlanError
from planner.execute import RunOptions
from planner.execute.checkpoint import latest_checkpoint, load_rank_file
from planner.execute.reference import reference_run
from planner.execute.run import run_plan
from planner.plan import load_plan

from test_run_support import write_plan

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
UNET = "tests.unet_model:build"
STEPS = 2


def _pplan(monkeypatch, capsys, *args):
    from cli.app import main

    monkeypatch.setattr(sys, "argv", ["pplan", *map(str, args)])
    code = 0
    try:
        main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_profiled_unet_plan_runs_and_equals_single_process(monkeypatch, capsys, tmp_path, schedule):
    monkeypatch.chdir(ROOT)  # `tests.unet_model` is found from the repository root (workers inherit it)
    prof, plan_json = tmp_path / "unet.csv", tmp_path / "plan.json"
    code, _, err = _pplan(monkeypatch, capsys, "profile", "--model", UNET, "-b", "2", "--warmup", "0", "--repeats", "1", "-o", prof)
    assert code == 0, err
    code, _, err = _pplan(monkeypatch, capsys, "partition", prof, "--devices", "2", "--global-batch", "8",
                          "--microbatches", "4", "--schedule", schedule, "--recompute", "none", "--out", plan_json)
    assert code == 0, err
    plan = load_plan(plan_json)
    assert plan.n_stages == 2 and not any(st.recompute for st in plan.stages)
    opts = RunOptions(steps=STEPS, warmup=1, device="cpu", lr=1e-2, checkpoint_dir=str(tmp_path / "ck"))
    run = run_plan(plan, opts, plan_path=str(plan_json)).run
    ref_losses, ref_layers = reference_run(plan, STEPS, lr=1e-2)
    assert run["loss_steps"] == list(range(STEPS))
    assert run["losses"] == pytest.approx(ref_losses, rel=1e-5, abs=1e-6)
    assert ref_losses[-1] != ref_losses[0]
    _, folder = latest_checkpoint(tmp_path / "ck", plan)
    got = {}
    for r in range(plan.n_devices):
        got.update(load_rank_file(folder, r)["layers"])
    assert sorted(got) == sorted(ref_layers)
    for i, sd in ref_layers.items():
        assert sorted(got[i]) == sorted(sd)
        for name, ref in sd.items():
            torch.testing.assert_close(got[i][name], ref, rtol=1e-4, atol=1e-5)


def test_unsupported_non_chain_plans_are_refused_up_front(monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(ROOT)
    prof = tmp_path / "unet.csv"
    code, _, err = _pplan(monkeypatch, capsys, "profile", "--model", UNET, "-b", "2", "--warmup", "0", "--repeats", "1", "-o", prof)
    assert code == 0, err
    cases = [("1f1b", [(0, 4), (4, 10)], {0: [1]}, "recompute"),
             ("zb", [(0, 4), (4, 10)], {}, "only gpipe and 1f1b"),
             ("interleaved", [(0, 2), (2, 5), (5, 7), (7, 10)], {}, "only gpipe and 1f1b")]
    for schedule, cuts, rec, match in cases:
        path = write_plan(tmp_path / f"{schedule}.json", UNET, schedule, 2, cuts, n_microbatches=4, recompute=rec, profile=prof)
        with pytest.raises(PlanError, match=match) as e:
            run_plan(load_plan(path), RunOptions(steps=1, device="cpu"), plan_path=str(path))
        assert "\n" not in str(e.value)
