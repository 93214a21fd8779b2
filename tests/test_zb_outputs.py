"""Zero-bubble (split I/W backward) runs of models whose output holds a tensor that a layer of the
last stage saved for its weight gradient, as models returning `(logits, hidden)` or a dict do.

torch's I step of a last stage detaches the stage's outputs in place, and its W step then reads
what the layers saved: the hidden state the head's weight gradient needs, if it is the very tensor
returned. So the last stage returns copies under split backwards (planner.execute.stages.PipeStage).
The memory tracker's saved-tensor hooks (first step and memory step only) hid the failure, so the
run goes on for three steps past them.
"""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from planner.execute.checkpoint import latest_checkpoint, load_rank_file
from planner.execute.reference import reference_run
from planner.execute.stages import build_stage_modules
from planner.models import build_model
from planner.plan import load_plan

from helpers.equivalence import EQUIVALENCE_THREADS, torch_threads
from helpers.plans import assert_trains_alike, run_plans_in_one_launch, write_plan

INPUT_SHAPE = (6,)
CUTS = [(0, 1), (1, 3)]  # the head and the layer before it on the last stage
STEPS = 5  # warm-up 1: steps 0 and 1 run under the memory tracker's hooks, steps 2-4 without


class HiddenTuple(nn.Module):
    """Returns (logits, hidden): the hidden state reaches the head's layer from the one before it."""

    def __init__(self):
        super().__init__()
        self.l1, self.l2, self.head = nn.Linear(6, 8), nn.Linear(8, 8), nn.Linear(8, 3)

    def forward(self, x):
        h = torch.relu(self.l2(self.l1(x)))
        return self.head(h), h


class HiddenDict(HiddenTuple):
    """Returns a dict, as Hugging Face models do."""

    def forward(self, x):
        h = torch.relu(self.l2(self.l1(x)))
        return {"logits": self.head(h), "hidden": h}


class NormHead(nn.Module):
    """A last layer that computes the hidden state it returns beside the logits."""

    def __init__(self):
        super().__init__()
        self.norm, self.proj = nn.LayerNorm(8), nn.Linear(8, 3)

    def forward(self, x):
        h = self.norm(x)
        return self.proj(h), h


def hidden_tuple():
    return HiddenTuple()


def hidden_dict():
    return HiddenDict()


def norm_head():
    return nn.Sequential(OrderedDict(l1=nn.Linear(6, 8), l2=nn.Linear(8, 8), head=NormHead()))


# imported by spec string: this folder is on the path of pytest and of the launched ranks
MODELS = ["test_zb_outputs:hidden_tuple", "test_zb_outputs:hidden_dict", "test_zb_outputs:norm_head"]


def _last_stage_outputs(tmp_path, spec: str, schedule: str):
    """(last stage module, its inputs as received, its outputs, the last layer's own outputs) of one micro-batch."""
    plan = load_plan(write_plan(tmp_path / f"{schedule}.json", spec, schedule, 2, CUTS))
    bundle = build_model(spec, input_shape=INPUT_SHAPE)
    x, _ = bundle.make_batch(2, 0)
    first, last = (build_stage_modules(plan, bundle.layers, r, example=x)[0].module for r in (0, 1))
    received = [t.detach().requires_grad_() for t in tree_leaves(first(x))]
    seen: list = []
    handle = list(bundle.layers.children())[-1].register_forward_hook(lambda m, a, out: seen.append(out))
    out = last(*received)
    handle.remove()
    return last, received, out, seen[0]


@pytest.mark.parametrize("spec", MODELS)
def test_last_stage_outputs_survive_torchs_in_place_detach(tmp_path, spec):
    """Split backward of the last stage as torch runs it: I, every non-view output detached in
    place (PipelineStage.backward_one_chunk), then W; the weight gradients equal a full backward's.
    1F1B's last stage returns the layer's own tensors (no copy, no memory added)."""
    from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

    last, received, out, _ = _last_stage_outputs(tmp_path, spec, "zb")
    loss = sum(t.square().sum() for t in tree_leaves(out))
    params = list(last.parameters())
    want = torch.autograd.grad(loss, params, retain_graph=True)
    _, groups = stage_backward_input([loss], None, received, iter(params))
    for t in tree_leaves(out):
        if not t._is_view():
            t.detach_()
    stage_backward_weight(iter(params), groups)
    for p, g in zip(params, want):
        torch.testing.assert_close(p.grad, g, rtol=0, atol=0)
    _, _, out, own = _last_stage_outputs(tmp_path, spec, "1f1b")
    assert all(a is b for a, b in zip(tree_leaves(out), tree_leaves(own)))


@pytest.mark.slow
def test_zero_bubble_runs_of_hidden_state_outputs_train_as_one_process(tmp_path):
    """Each model's zb plan trains past the tracked steps with the one-process run's losses and weights."""
    plans = [load_plan(write_plan(tmp_path / f"plan{i}.json", spec, "zb", 2, CUTS, seed=3)) for i, spec in enumerate(MODELS)]
    losses = run_plans_in_one_launch(plans, [INPUT_SHAPE] * len(plans), tmp_path, STEPS)
    for i, plan in enumerate(plans):
        _, folder = latest_checkpoint(tmp_path / f"ck{i}", plan)
        got: dict = {}
        for r in range(plan.n_devices):
            got.update(load_rank_file(folder, r)["layers"])
        with torch_threads(EQUIVALENCE_THREADS):
            ref_losses, ref = reference_run(plan, STEPS, lr=1e-2, model_kwargs={"input_shape": INPUT_SHAPE})
        assert_trains_alike(losses[i], got, ref_losses, ref, loss_rel=1e-12, atol=0.0)
