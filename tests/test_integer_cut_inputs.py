"""A cut that sends integer token ids to a later stage's embedding trains as one process does.

torch 2.13's PipelineStage, built without example tensors, sets itself up at the first step by
running each non-first stage once on uninitialised tensors: token ids crossing a cut were then
garbage and the embedding after it failed (`IndexError: index out of range in self`).
build_pipeline now gives every stage the tensors it receives and returns for one micro-batch
(planner.execute.stage_io), so torch's static set-up runs no stage on placeholders.

The model (`test_integer_cut_inputs:build`, this module, imported by the ranks from tests/ on
PYTHONPATH): `shift` (token ids in, token ids out, no parameters), `embed`, `pool`, `head`.
The runs go through the CLI's `pplan run` on 2 and 4 local processes, cut after `shift` under
1f1b, gpipe and interleaved (and zb cut after `embed`), and must give the losses (within 1e-12
relative: both average four float32 micro-batch losses in float64) and the weights (bit for
bit) of planner.execute.reference's one-process run. zb cut after `shift` gave the second stage,
whose only input is the ids, no weight gradient until planner.execute.weight_backward ran its I as a
full backward.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from torch import nn

from planner.execute.checkpoint import latest_checkpoint, load_rank_file
from planner.execute.reference import reference_run
from planner.execute.stages import build_stage_modules
from planner.models import build_model
from planner.plan import load_plan

from helpers.equivalence import torch_threads
from helpers.plans import assert_trains_alike, write_plan

SPEC = "test_integer_cut_inputs:build"
VOCAB, SEQ = 1000, 16
INPUT = {"input_shape": (SEQ,), "input_dtype": "long", "vocab": VOCAB}
FLAGS = ["--input-shape", str(SEQ), "--input-dtype", "long", "--vocab", str(VOCAB)]
STEPS, LR = 2, 1e-2


class Shift(nn.Module):
    """Parameter-free: token ids in, token ids out (a tokenizer-side remap)."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return (ids + 1) % VOCAB


class Pool(nn.Module):
    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h.mean(1)


def build(dim: int = 32) -> nn.Sequential:
    return nn.Sequential(OrderedDict(shift=Shift(), embed=nn.Embedding(VOCAB, dim), pool=Pool(), head=nn.Linear(dim, 10)))


def _plan(tmp_path: Path, schedule: str, devices: int, cuts: list[tuple[int, int]]):
    return load_plan(write_plan(tmp_path / "plan.json", SPEC, schedule, devices, cuts))


@pytest.mark.parametrize("rank", [0, 1])
def test_each_stage_gets_the_token_ids_it_receives_and_sends(tmp_path, rank):
    plan = _plan(tmp_path, "1f1b", 2, [(0, 1), (1, 4)])
    bundle = build_model(SPEC, seed=0, **INPUT)
    x, _ = bundle.make_batch(plan.micro_batch_size, 0)
    (m,) = build_stage_modules(plan, bundle.layers, rank, x)
    shifted = (x + 1) % VOCAB
    if rank == 0:
        assert torch.equal(m.example.inputs[0], x) and torch.equal(m.example.outputs[0], shifted)
    else:  # real token ids, not placeholders: what the embedding reads
        assert torch.equal(m.example.inputs[0], shifted)
        (out,) = m.example.outputs
        assert out.shape == (plan.micro_batch_size, 10) and out.dtype == torch.float32
        assert out.requires_grad  # the head's output carries the loss's gradient
    assert not any(t.requires_grad for t in m.example.inputs)  # token ids need no gradient, so torch receives none


def test_a_float_cut_requires_grad_as_training_computes_it(tmp_path):
    plan = _plan(tmp_path, "1f1b", 2, [(0, 2), (2, 4)])
    bundle = build_model(SPEC, seed=0, **INPUT)
    x, _ = bundle.make_batch(plan.micro_batch_size, 0)
    (m,) = build_stage_modules(plan, bundle.layers, 1, x)
    (h,) = m.example.inputs
    assert h.shape == (plan.micro_batch_size, SEQ, 32) and h.requires_grad and h.is_leaf
    modes = [mod.training for mod in bundle.layers.modules()]
    assert all(modes), "the set-up forwards put every module back in training mode"


def test_without_a_micro_batch_sized_example_torch_sets_stages_up_itself(tmp_path):
    plan = _plan(tmp_path, "1f1b", 2, [(0, 1), (1, 4)])
    bundle = build_model(SPEC, seed=0, **INPUT)
    x, _ = bundle.make_batch(plan.micro_batch_size + 1, 0)  # a user's example of another size
    assert build_stage_modules(plan, bundle.layers, 1, x)[0].example is None
    assert build_stage_modules(plan, bundle.layers, 1)[0].example is None


@pytest.mark.slow
@pytest.mark.parametrize("schedule,devices,cuts", [
    ("1f1b", 2, [(0, 1), (1, 4)]),
    ("gpipe", 4, [(0, 1), (1, 2), (2, 3), (3, 4)]),
    ("interleaved", 2, [(0, 1), (1, 2), (2, 3), (3, 4)]),  # stage 0 -> 1 crosses ranks with the ids
    ("zb", 2, [(0, 2), (2, 4)]),  # split backward, its first stage embedding the ids
    # torch's split backward finds a stage's weights from its inputs' gradient paths: a stage whose inputs
    # need none (the ids) got no weight gradient and trained on wrong (planner.execute.weight_backward)
    ("zb", 2, [(0, 1), (1, 4)]),
    ("zb", 3, [(0, 1), (1, 2), (2, 4)]),  # the same on a middle stage, which sends an activation gradient on
], ids=["1f1b-2", "gpipe-4", "interleaved-2", "zb-2-embed-first", "zb-2-ids-cut", "zb-3-ids-middle"])
def test_pplan_run_over_a_token_id_cut_equals_one_process(run_cli, tmp_path, schedule, devices, cuts):
    plan = _plan(tmp_path, schedule, devices, cuts)
    run_json, ck = tmp_path / "run.json", tmp_path / "ck"
    done = run_cli("run", tmp_path / "plan.json", "--model", SPEC, *FLAGS, "--steps", STEPS, "--lr", LR, "--threads", 1,
                   "--checkpoint-dir", ck, "-o", run_json)
    assert done.returncode == 0, done.stderr
    losses = json.loads(run_json.read_text(encoding="utf-8"))["losses"]
    _, folder = latest_checkpoint(ck, plan)
    got: dict = {}
    for r in range(plan.n_devices):
        got.update(load_rank_file(folder, r)["layers"])
    with torch_threads(1):  # the ranks' thread count: CPU kernels split reductions by thread
        ref_losses, ref = reference_run(plan, STEPS, lr=LR, model_kwargs=INPUT)
    assert_trains_alike(losses, got, ref_losses, ref, loss_rel=1e-12, atol=0.0)
