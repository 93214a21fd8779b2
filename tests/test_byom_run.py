"""Bring your own model, run: pipelined training of user and Hugging Face models equals one
process (multi-process, slow).

Exact where nothing reorders (same threads, shapes and order: docs/executor.md); models with
a tied weight (GPT-2, BERT) sum that weight's gradient across two stages after torch has
scaled each stage's part by 1/M, where one process accumulates both parts per micro-batch:
a few float32 ulps, which Adam at lr 1e-2 turns into weight differences below TIED_ATOL.
"""

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
from helpers.models import HF_SPECS
from helpers.plans import write_plan

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
STEPS = 3
TIED_ATOL = 1e-4
IMG = (3, 16, 16)

# (model, input shape, schedule, stages (layers), recompute {stage: [layers]}, tied)
CASES = {
    "cnn-1f1b-2": ("examples.byom_models:cnn", IMG, "1f1b", [(0, 5), (5, 11)], {}, False),
    "cnn-zb-3": ("examples.byom_models:cnn", IMG, "zb", [(0, 3), (3, 8), (8, 11)], {}, False),
    "residual-interleaved-2": ("examples.byom_models:residual", IMG, "interleaved", [(0, 2), (2, 3), (3, 5), (5, 7)], {1: [2], 2: [3]}, False),
    "residual-gpipe-3": ("examples.byom_models:residual", IMG, "gpipe", [(0, 3), (3, 4), (4, 7)], {}, False),
    "vit-seq-1f1b-2": ("examples.byom_models:vit", IMG, "1f1b", [(0, 2), (2, 5)], {}, False),
    "hf-gpt2-tied-1f1b-2": (HF_SPECS["gpt2"], (16,), "1f1b", [(0, 2), (2, 4)], {}, True),
    "hf-gpt2-untied-zb-3": (HF_SPECS["gpt2-untied"], (16,), "zb", [(0, 1), (1, 3), (3, 4)], {}, False),
    "hf-llama-gpipe-2": (HF_SPECS["llama"], (16,), "gpipe", [(0, 2), (2, 4)], {0: [1]}, False),
    "hf-bert-1f1b-3": (HF_SPECS["bert"], (16,), "1f1b", [(0, 1), (1, 3), (3, 4)], {}, True),
    "hf-vit-interleaved-2": (HF_SPECS["vit"], None, "interleaved", [(0, 1), (1, 2), (2, 3), (3, 4)], {}, False),
    "hf-resnet-1f1b-3": (HF_SPECS["resnet"], IMG, "1f1b", [(0, 1), (1, 2), (2, 4)], {2: [2]}, False),
}


def _layers_after_run(tmp_path: Path, plan, opts: RunOptions) -> tuple[list[float], dict]:
    run = run_plan(plan, opts, plan_path=str(tmp_path / "plan.json")).run
    _, folder = latest_checkpoint(opts.checkpoint_dir, plan)
    got: dict = {}
    for r in range(plan.n_devices):
        got.update(load_rank_file(folder, r)["layers"])
    return run["losses"], got


def _compare(got: dict, ref: dict, atol: float) -> None:
    assert sorted(got) == sorted(ref)
    for i, sd in ref.items():
        assert sorted(got[i]) == sorted(sd)  # parameters and buffers (BatchNorm statistics)
        for name, want in sd.items():
            torch.testing.assert_close(got[i][name], want, rtol=0, atol=atol, msg=lambda m, i=i, n=name: f"layer {i} {n}: {m}")


@pytest.mark.parametrize("case", sorted(CASES))
def test_pipelined_equals_one_process(monkeypatch, tmp_path, case):
    model, shape, schedule, stages, recompute, tied = CASES[case]
    if model.startswith("hf:"):
        pytest.importorskip("transformers")
    monkeypatch.chdir(ROOT)
    devices = 2 if schedule == "interleaved" else len(stages)
    path = write_plan(tmp_path / "plan.json", model, schedule, devices, stages, n_microbatches=4, recompute=recompute)
    plan = load_plan(path)
    opts = RunOptions(steps=STEPS, warmup=1, device="cpu", lr=1e-2, threads=EQUIVALENCE_THREADS,
                      checkpoint_dir=str(tmp_path / "ck"), input_shape=shape)
    losses, got = _layers_after_run(tmp_path, plan, opts)
    with torch_threads(EQUIVALENCE_THREADS):
        ref_losses, ref = reference_run(plan, STEPS, lr=1e-2, model_kwargs={"input_shape": shape} if shape else {})
    assert losses == pytest.approx(ref_losses, rel=1e-6 if tied else 1e-12, abs=0)
    _compare(got, ref, TIED_ATOL if tied else 0.0)


@pytest.mark.parametrize("model,flags", [
    ("examples.byom_models:mlp", ["--input-shape", "784"]),  # docs/models.md's example
    (HF_SPECS["gpt2"], ["--input-shape", "16"]),
])
def test_profile_partition_run_needs_no_flag_twice(pplan, monkeypatch, tmp_path, model, flags):
    """The user's path with partition's own choice of schedule, cuts and recompute: `run` reads
    the input description from the profile, and trains as one process would."""
    if model.startswith("hf:"):
        pytest.importorskip("transformers")
    monkeypatch.chdir(ROOT)
    prof, plan_json = tmp_path / "p.csv", tmp_path / "plan.json"
    code, _, err = pplan("profile", "--model", model, *flags, "-b", "2,4", "--warmup", "0", "--repeats", "1", "-o", prof)
    assert code == 0, err
    code, _, err = pplan("partition", prof, "--devices", "2", "--global-batch", "8", "--out", plan_json)
    assert code == 0, err
    code, out, err = pplan("run", plan_json, "--steps", "2", "--lr", "1e-2", "--threads", "1",
                            "--model", model, "--checkpoint-dir", tmp_path / "ck")
    assert code == 0, err
    assert "loss:" in out
    plan = load_plan(plan_json)
    _, folder = latest_checkpoint(tmp_path / "ck", plan)
    got: dict = {}
    for r in range(plan.n_devices):
        got.update(load_rank_file(folder, r)["layers"])
    with torch_threads(1):
        _, ref = reference_run(plan, 2, lr=1e-2, model_kwargs={"input_shape": (784,) if "mlp" in model else (16,)})
    _compare(got, ref, TIED_ATOL)
