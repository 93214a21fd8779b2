"""`pplan run` on a non-chain model: the U-Net's stages split by torch's pipeline() at the
planned cuts (skip tensors relayed stage to stage) train exactly like one process with
gradient accumulation (multi-process, slow)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from planner.execute import RunOptions
from planner.execute.checkpoint import latest_checkpoint, load_rank_file
from planner.execute.reference import reference_run
from planner.execute.run import run_plan
from planner.plan import load_plan

from helpers.equivalence import EQUIVALENCE_THREADS, torch_threads
from helpers.plans import write_plan

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
UNET = "tests.unet_model:build"
STEPS = 2


def test_profiled_unet_plan_is_a_runnable_two_stage_plan(pplan, monkeypatch, tmp_path):
    """profile -> partition -> run on the user's path. The cuts come from a timed profile and so
    vary from machine to machine: only structure is checked here, equivalence below on fixed cuts."""
    monkeypatch.chdir(ROOT)  # `tests.unet_model` is found from the repository root (workers inherit it)
    prof, plan_json = tmp_path / "unet.csv", tmp_path / "plan.json"
    code, _, err = pplan("profile", "--model", UNET, "-b", "2", "--warmup", "0", "--repeats", "1", "-o", prof)
    assert code == 0, err
    code, _, err = pplan("partition", prof, "--devices", "2", "--global-batch", "8",
                          "--microbatches", "4", "--schedule", "1f1b", "--recompute", "none", "--out", plan_json)
    assert code == 0, err
    plan = load_plan(plan_json)
    assert plan.n_stages == 2 and not any(st.recompute for st in plan.stages)
    layers = [i for st in plan.stages for i in range(*st.layers)]
    assert layers == list(range(10))  # contiguous, each layer once
    run = run_plan(plan, RunOptions(steps=1, warmup=0, device="cpu"), plan_path=str(plan_json), model=UNET).record.to_dict()
    assert run["loss_steps"] == [0]
    assert all(0.0 < v < 10.0 for v in run["losses"])  # cross-entropy of 2 classes starts near ln 2


# cut 5: e1 (layer 0) and e2 (layer 2) both cross the cut; cut 7: only e1 skips into stage 1
@pytest.mark.parametrize("schedule,cut", [("1f1b", 5), ("gpipe", 5), ("1f1b", 7)])
def test_unet_pipeline_equals_single_process(monkeypatch, tmp_path, schedule, cut):
    """Pipelined training equals single-process gradient accumulation, bit for bit.

    Why exact, not a tolerance: everything that decides the bits is pinned. Fixed cuts (not from a
    timed profile); the same kernels on the same micro-batch shapes (2 samples) in the same order
    (micro-batch 0..3); the same torch thread count in the ranks and in the reference (CPU conv
    weight-gradient kernels split their reduction by thread, so 1 vs 2 threads changes the float32
    summation order); and M = 4, a power of two, so the reference's (loss / M).backward() and
    torch's scaling of the accumulated gradients by 1/M are both exact. Under those conditions
    nothing reorders, so any difference is a real executor bug.

    No tolerance could stand in for that pinning: an Adam step is lr * m_hat / (sqrt(v_hat) + eps),
    invariant to the gradient's scale, so a few-ulp reordering error (of the tensor's largest
    terms) in a gradient element near zero moves that weight by a sizeable fraction of lr. That is
    what failed before (ranks ran 1 thread each, the reference 2: mid.0.weight[11,2,1,2] off by
    3.2e-5 at lr 1e-2, whatever the cuts).
    """
    monkeypatch.chdir(ROOT)
    path = write_plan(tmp_path / "plan.json", UNET, schedule, 2, [(0, cut), (cut, 10)], n_microbatches=4)
    plan = load_plan(path)
    assert plan.optimizer == "adam" and plan.n_microbatches == 4
    opts = RunOptions(steps=STEPS, warmup=1, device="cpu", lr=1e-2, threads=EQUIVALENCE_THREADS, checkpoint_dir=str(tmp_path / "ck"))
    run = run_plan(plan, opts, plan_path=str(path), model=UNET).record.to_dict()
    with torch_threads(EQUIVALENCE_THREADS):
        ref_losses, ref_layers = reference_run(plan, STEPS, lr=1e-2)
    assert run["loss_steps"] == list(range(STEPS))
    # both average the same four float32 micro-batch losses in float64, in possibly different
    # order: at most a few float64 ulps apart
    assert run["losses"] == pytest.approx(ref_losses, rel=1e-12, abs=0)
    assert ref_losses[-1] != ref_losses[0]
    _, folder = latest_checkpoint(tmp_path / "ck", plan)
    got = {}
    for r in range(plan.n_devices):
        got.update(load_rank_file(folder, r)["layers"])
    assert sorted(got) == sorted(ref_layers)
    for i, sd in ref_layers.items():
        assert sorted(got[i]) == sorted(sd)
        for name, ref in sd.items():
            torch.testing.assert_close(got[i][name], ref, rtol=0, atol=0, msg=lambda m, i=i, n=name: f"layer {i} {n}: {m}")
