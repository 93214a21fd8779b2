"""A pipeline rank holds only its own layers' weights, for Hugging Face models too.

Every rank builds the whole model and keeps its stages (planner.execute.stages). A `hf:` model's
layers run the transformers model's own code, so they keep the whole model reachable; the rank's
release (planner.models.hf_release, called by planner.execute.train right after build_pipeline)
empties every weight no kept layer holds. These tests cut tiny models as a 2-device plan would,
release as a rank does, and check that no other rank's weight is alive, that a weight the rank
shares (tied embeddings) stays, and that the kept stage still computes what one process does.
"""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest
import torch
from torch import nn

from planner.execute.stages import build_stage_modules
from planner.models import build_model
from planner.models.hf_release import hollow_parameters, release_other_layers
from planner.plan import load_plan

from helpers.models import HF_SPECS
from helpers.plans import write_plan

pytest.importorskip("transformers")

SHAPES = {"llama": (16,), "gpt2": (16,), "bert": (16,), "vit": None}
"""Families checked (rotary tables, tied embeddings, a masked LM, an image model) -> --input-shape."""


def _two_rank_plan(tmp_path: Path, name: str):
    # embed, block0 | block1, head: every family of SHAPES has 4 layers
    return load_plan(write_plan(tmp_path / "plan.json", HF_SPECS[name], "1f1b", 2, [(0, 2), (2, 4)]))


def _kept_stages(plan, name: str, rank: int):
    """(stage modules of `rank`, weak references to the other layers' parameters the rank does not
    hold), after releasing the rest of the model as a rank does."""
    bundle = build_model(plan.model, seed=plan.seed, input_shape=SHAPES[name])
    example = bundle.make_batch(plan.micro_batch_size, 0)[0]
    mods = build_stage_modules(plan, bundle.layers, rank, example)
    kept = {id(p) for m in mods for p in m.module.parameters()}
    kept_layers = {id(layer) for m in mods for layer in m.layers}
    others = [weakref.ref(p) for layer in bundle.layers.children() if id(layer) not in kept_layers
              for p in layer.parameters() if id(p) not in kept]
    assert others, "the other rank's layers have parameters of their own"
    release_other_layers(bundle.layers, [p for m in mods for p in m.module.parameters()])
    del bundle, example
    gc.collect()
    return mods, others


@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("name", sorted(SHAPES))
def test_a_rank_keeps_no_weight_of_another_ranks_layers_and_computes_as_one_process(tmp_path, name, rank):
    plan = _two_rank_plan(tmp_path, name)
    mods, others = _kept_stages(plan, name, rank)
    alive = [r() for r in others if r() is not None]
    assert not alive, f"{len(alive)} of {len(others)} parameters of the other rank's layers are alive, e.g. {tuple(alive[0].shape)}"

    # the kept layers, on a batch size no probe recorded, give what the whole model gives
    ref = build_model(plan.model, seed=plan.seed, input_shape=SHAPES[name])
    x, _ = ref.make_batch(3, 7)
    with torch.no_grad():
        h = x
        for layer in list(ref.layers.children())[:mods[0].first]:
            h = layer(h)
        want = h
        for layer in list(ref.layers.children())[mods[0].first:mods[0].end]:
            want = layer(want)
        got = h
        for layer in mods[0].layers:
            got = layer(got)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_a_tied_embedding_the_rank_holds_stays_one_live_weight(tmp_path):
    plan = _two_rank_plan(tmp_path, "gpt2")
    mods, _ = _kept_stages(plan, "gpt2", 1)  # block1 and the LM head, whose weight is the embedding's
    head = mods[0].layers[-1]
    source = head.run.__self__.root  # the transformers model the head's code runs
    weight = source.get_output_embeddings().weight
    assert source.get_input_embeddings().weight is weight
    assert any(p is weight for p in head.parameters()) and weight.requires_grad
    assert weight.untyped_storage().nbytes() == weight.numel() * weight.element_size()


def test_released_weights_are_one_element_placeholders_without_gradients():
    model = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 4))
    kept = list(model[1].parameters())
    released = hollow_parameters(model, kept)
    assert released == (8 * 16 + 16) * 4
    for p in model[0].parameters():
        assert not p.requires_grad and p.untyped_storage().nbytes() == p.element_size()
        assert p.abs().sum().item() == 0
    assert model[0].weight.shape == (16, 8) and model(torch.randn(2, 8)).shape == (2, 4)
    assert all(p is q for p, q in zip(model[1].parameters(), kept))
    assert hollow_parameters(model, kept) == 0  # released twice: nothing more to release


def test_a_plain_sequential_only_loses_its_layers():
    layers = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    first = layers[0]
    weight = first.weight.detach().clone()
    assert release_other_layers(layers, list(first.parameters())) == 0
    assert len(layers) == 0 and torch.equal(first.weight, weight)
