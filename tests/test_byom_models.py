"""Bring your own model, in one process: `hf:` specs, the split equals the model's own forward
and loss, and user models with in-place ops, BatchNorm, Flatten, views and residuals profile."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from planner.errors import ModelSpecError
from planner.models import build_model, layer_count, parse_spec

from helpers.models import HF_SPECS

ROOT = Path(__file__).resolve().parents[1]
IMAGE = {"vit": None, "resnet": (3, 16, 16), "convnext": (3, 16, 16)}


def test_hf_spec_parses_without_torch_work():
    kind, p = parse_spec("hf:resnet:depths=1/1,hidden_sizes=8/16,num_labels=10")
    assert kind == "hf" and p == {"model_type": "resnet", "config": {"depths": [1, 1], "hidden_sizes": [8, 16], "num_labels": 10}}
    with pytest.raises(ModelSpecError, match="not a Hugging Face model type"):
        parse_spec("hf:")
    with pytest.raises(ModelSpecError, match="given twice"):
        parse_spec("hf:gpt2:n_layer=2,n_layer=3")


@pytest.mark.parametrize("name", sorted(HF_SPECS))
def test_hf_split_equals_the_models_own_forward_and_loss(name):
    pytest.importorskip("transformers")
    shape = IMAGE.get(name, (16,))
    bundle = build_model(HF_SPECS[name], seed=0, input_shape=shape)
    model = bundle.layers.source
    assert layer_count(HF_SPECS[name], input_shape=shape) == len(bundle.layers) == 4  # embed, 2 blocks/stages, head
    x, y = bundle.make_batch(3, 1)
    bundle.layers.eval()
    model.eval()
    with torch.no_grad():
        ours = bundle.layers(x)
        if name in IMAGE:
            theirs = model(pixel_values=x, labels=y)
        else:
            theirs = model(input_ids=x, labels=y)
    torch.testing.assert_close(ours, theirs.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(bundle.loss_fn(ours, y), theirs.loss, rtol=1e-5, atol=1e-6)
    assert bundle.input_meta["input_dtype"] == ("float" if name in IMAGE else "long")


def test_hf_tied_embeddings_stay_one_parameter():
    pytest.importorskip("transformers")
    tied = build_model(HF_SPECS["gpt2"], input_shape=(16,)).layers
    # the embedding is the first stage's, the LM head the last's: one Parameter in both
    assert {id(p) for p in tied.embed.parameters()} & {id(p) for p in tied.head.parameters()}
    assert tied.source.get_input_embeddings().weight is tied.source.get_output_embeddings().weight
    untied = build_model(HF_SPECS["gpt2-untied"], input_shape=(16,)).layers
    assert not {id(p) for p in untied.embed.parameters()} & {id(p) for p in untied.head.parameters()}


def test_hf_errors_are_one_line():
    pytest.importorskip("transformers")
    with pytest.raises(ModelSpecError, match="not a causal LM, masked LM or image classifier"):
        build_model("hf:t5:num_layers=1")
    with pytest.raises(ModelSpecError, match="one number, tokens per sample"):
        build_model(HF_SPECS["gpt2"], input_shape=(3, 16))


def test_in_place_ops_are_made_out_of_place():
    from planner.graph.trace import out_of_place_graph

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(4, 4)

        def forward(self, x):
            h = self.a(x)
            h += x
            return torch.nn.functional.relu(h, inplace=True).add_(1)

    gm = torch.fx.symbolic_trace(M())
    assert out_of_place_graph(gm.graph) == 2  # fx already records `h += x` as operator.add
    targets = [n.target for n in gm.graph.nodes]
    assert "add" in targets and "add_" not in targets
    assert all(n.kwargs.get("inplace") is not True for n in gm.graph.nodes)
    bundle = build_model("examples.byom_models:cnn", input_shape=(3, 16, 16))
    assert not any(getattr(m, "inplace", False) for m in bundle.layers.modules())


@pytest.mark.parametrize("name,n_layers", [("cnn", 11), ("residual", 7), ("vit", 5), ("mlp", 3)])
def test_user_models_profile(monkeypatch, name, n_layers):
    """In-place ReLU, BatchNorm, Flatten (cnn), residuals and tuple outputs (residual), a
    non-contiguous view at every cut (vit): each profiles, and a classifier gets cross-entropy."""
    from planner.profiling.profiler import profile_model

    monkeypatch.chdir(ROOT)
    shape = (784,) if name == "mlp" else (3, 16, 16)
    prof = profile_model(f"examples.byom_models:{name}", [2], warmup=0, repeats=1, threads=1, input_shape=shape)
    assert prof.n_layers == n_layers
    assert prof.meta["input_shape"] == ",".join(map(str, shape))
    bundle = build_model(f"examples.byom_models:{name}", input_shape=shape)
    _, y = bundle.make_batch(2, 0)
    assert y.dtype == (torch.float32 if name == "mlp" else torch.long)


def test_hf_profile_records_its_input(monkeypatch):
    pytest.importorskip("transformers")
    from planner.profiling.profiler import profile_model

    prof = profile_model(HF_SPECS["gpt2"], [2], warmup=0, repeats=1, threads=1, input_shape=(16,))
    assert prof.n_layers == 4 and prof.names == ("embed", "block0", "block1", "head")
    assert (prof.meta["input_shape"], prof.meta["input_dtype"], prof.meta["vocab"]) == ("16", "long", "128")


def test_factory_layer_count_needs_the_input_description(monkeypatch):
    monkeypatch.chdir(ROOT)
    with pytest.raises(ModelSpecError, match="does not say what its input is"):
        layer_count("examples.byom_models:residual")
    assert layer_count("examples.byom_models:residual", input_shape=(3, 16, 16)) == 7
