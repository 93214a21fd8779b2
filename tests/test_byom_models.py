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


# --- found by the issue 13 acceptance hunt (models pplan had not seen; tests/factory_models.py) ---

def test_shapes_read_across_a_cut_are_recomputed_not_sent():
    """`b, c, h, w = x.shape` after `features`, used by `mid`: only tensors cross the cut (the
    executor can send nothing else), and the layer reading the ints computes them again."""
    bundle = build_model("factory_models:shapes_across_a_cut", input_shape=(3, 8, 8))
    lg = bundle.layers.graph
    assert lg.names == ("features", "mid", "classifier") and lg.skip_edges == ()
    x, _ = bundle.make_batch(2, 0)
    env = bundle.layers[0](x)
    assert all(isinstance(v, torch.Tensor) for v in env.values()), env
    env = bundle.layers[1](env)
    assert all(isinstance(v, torch.Tensor) for v in env.values()), env
    assert lg.output_bytes_per_sample[:2] == (4 * 4 * 4 * 4, 4 * 4 * 4 * 4)  # the pooled map, then the flat view
    model = bundle.layers.source
    torch.testing.assert_close(bundle.layers(x), model(x), rtol=0, atol=0)


@pytest.mark.parametrize("spec", ["factory_models:two_heads", "factory_models:two_heads:target=dict"])
def test_a_structured_target_travels_packed_and_the_loss_is_the_users(spec):
    from torch.utils._pytree import tree_leaves

    bundle = build_model(spec)
    raw = __import__("factory_models").two_heads(**({"target": "dict"} if "dict" in spec else {}))
    x, packed = bundle.make_batch(4, 3)
    rx, target = raw.make_batch(4, 3)
    assert torch.equal(x, rx) and isinstance(packed, torch.Tensor) and packed.dtype == torch.int64 and packed.shape[0] == 4
    # a micro-batch of the packed target is the packed micro-batch (split along the batch)
    out = bundle.layers(x)
    assert isinstance(out, tuple) and len(out) == 2  # the dict output leaves the last layer as a tuple
    torch.testing.assert_close(bundle.loss_fn(out, packed), raw.loss_fn(bundle.layers.source(x), target), rtol=0, atol=0)
    half = bundle.loss_fn(tuple(t[:2] for t in out), packed[:2])
    mine = {"logits": out[0][:2], "box": out[1][:2]}
    want = raw.loss_fn(mine, tuple(t[:2] for t in tree_leaves(target)) if "dict" not in spec else {k: v[:2] for k, v in target.items()})
    torch.testing.assert_close(half, want, rtol=0, atol=0)


def test_targets_pack_bit_for_bit():
    from planner.models.targets import pack_structured_target

    big = torch.tensor([[2**62 + 1], [-(2**40) - 3]])
    leaves = {"ids": big, "x": torch.randn(2, 3, dtype=torch.float64), "h": torch.randn(2, 2).to(torch.bfloat16),
              "m": torch.tensor([[True, False], [False, True]]), "f": torch.tensor([[float("nan"), -0.0], [float("inf"), 1e-30]])}
    seen = {}
    make, loss = pack_structured_target(lambda b, s: (torch.zeros(b, 1), {k: v[:b] for k, v in leaves.items()}),
                                        lambda out, t: seen.update(t) or torch.zeros(()), "test")
    loss(None, make(2, 0)[1])
    for k, v in leaves.items():
        assert seen[k].dtype == v.dtype and torch.equal(seen[k].view(torch.uint8) if v.dtype != torch.bool else seen[k],
                                                        v.view(torch.uint8) if v.dtype != torch.bool else v), k
    with pytest.raises(ModelSpecError, match="not tensors with a batch dimension"):
        pack_structured_target(lambda b, s: (torch.zeros(b), (torch.zeros(b), 3)), lambda o, t: 0, "m:f")


def test_a_plain_model_with_two_outputs_regresses_each():
    bundle = build_model("factory_models:two_heads_plain", input_shape=(6,))
    x, packed = bundle.make_batch(3, 0)
    out = bundle.layers(x)
    loss = bundle.loss_fn(out, packed)
    assert loss.ndim == 0 and loss.item() > 0
    pair = build_model("factory_models:tuple_output", input_shape=(4,))  # a Sequential whose last layer returns (x, x)
    x, packed = pair.make_batch(2, 0)
    assert pair.loss_fn(pair.layers(x), packed).ndim == 0
    with pytest.raises(ModelSpecError, match="returns a tuple holding int, where pplan needs tensors") as e:
        build_model("factory_models:int_output", input_shape=(4,))
    assert "\n" not in str(e.value)


def test_transformer_encoder_is_cut_between_its_blocks():
    """nn.TransformerEncoder is one module holding nearly every weight: traced as its loop over
    layers and split (planner.graph.balance), so a plan can cut between the blocks; in training
    (no masks) it computes what the module does."""
    spec = "factory_models:encoder"
    bundle = build_model(spec, input_shape=(8,), input_dtype="long", vocab=32)
    assert [n for n, _ in bundle.layers.named_children()] == ["embed", "encoder_layers_0", "encoder_layers_1", "encoder_layers_2", "head"]
    x, _ = bundle.make_batch(3, 0)
    model = bundle.layers.source
    torch.manual_seed(0)
    torch.testing.assert_close(bundle.layers(x), model(x), rtol=0, atol=0)


def test_a_heavy_layer_that_is_one_weight_stays_whole():
    from planner.graph.trace import trace_layers

    class Heavy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.small = torch.nn.Linear(2, 2)
            self.big = torch.nn.Sequential(torch.nn.Linear(2, 64), torch.nn.Tanh())  # one weight: not spread
            self.blocks = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64))  # two: split

        def forward(self, x):
            return self.blocks(self.big(self.small(x)))

    lg = trace_layers(Heavy(), torch.randn(1, 2), balance=True)
    assert lg.names == ("small", "big", "blocks.0", "blocks.1") and lg.expanded == ("blocks",)
    assert trace_layers(Heavy(), torch.randn(1, 2)).names == ("small", "big", "blocks")

    class Encoder(torch.nn.Module):  # torchvision's ViT encoder: a position add, its blocks in a Sequential, a norm
        def __init__(self):
            super().__init__()
            self.pos = torch.nn.Parameter(torch.zeros(1, 64))
            self.layers = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64))
            self.ln = torch.nn.LayerNorm(64)

        def forward(self, x):
            return self.ln(self.layers(x + self.pos))

    class Vit(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj, self.encoder, self.head = torch.nn.Linear(2, 64), Encoder(), torch.nn.Linear(64, 2)

        def forward(self, x):
            return self.head(self.encoder(self.proj(x)))

    model = Vit()
    lg = trace_layers(model, torch.randn(1, 2), balance=True)
    assert lg.names == ("proj", "encoder", "encoder.layers.0", "encoder.layers.1", "encoder.ln", "head")
    assert lg.expanded == ("encoder", "encoder.layers")
    x = torch.randn(3, 2)
    torch.testing.assert_close(__import__("planner.graph", fromlist=["as_sequential"]).as_sequential(lg, model)(x), model(x), rtol=0, atol=0)


def test_a_value_read_in_a_stage_and_passed_on_survives_split_backward():
    """Stage [b, cls] of two_heads reads b's output in cls and passes it on to reg. torch's I step
    detaches stage outputs in place and its W step then needs what cls saved: the stage sends a
    copy, and I + W give the gradients of one backward."""
    from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight
    from torch.utils._pytree import tree_flatten

    from planner.execute.stages import PipeStage, boundary_specs

    bundle = build_model("factory_models:two_heads")
    x, _ = bundle.make_batch(2, 0)
    kids = list(bundle.layers.children())
    specs = boundary_specs(bundle.layers, x)
    with torch.no_grad():
        env = kids[0](x)

    def run() -> tuple[list, list, PipeStage]:
        received = [t.detach().requires_grad_() for t in tree_flatten(env)[0]]
        stage = PipeStage(kids[1:3], specs[0][0], specs[2][0])
        outs = stage(*received)
        return received, list(outs), stage

    received, outs, stage = run()
    grads = [torch.full_like(o, 0.5) for o in outs]
    torch.autograd.backward(outs, grads)
    want = [p.grad.clone() for p in stage.parameters()] + [received[0].grad.clone()]
    stage.zero_grad(set_to_none=True)
    received, outs, stage = run()
    params = list(stage.parameters())
    dinputs, groups = stage_backward_input(outs, grads, received, iter(params))
    stage_backward_weight(iter(params), groups, retain_graph=True)
    for got, w in zip([p.grad for p in params] + [dinputs[0]], want):
        torch.testing.assert_close(got, w, rtol=0, atol=0)


def test_recompute_restores_a_buffer_the_module_reassigns(monkeypatch):
    """A running statistic kept by reassignment (`self.x_min = self.x_min + ...`, I-BERT's
    QuantAct, a hand-written EMA) is put back after a recompute, as an in-place one is."""
    from planner.execute.measure import recorder
    from planner.execute.stages import Checkpointed

    class Ema(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 3)
            self.register_buffer("mean", torch.zeros(3))

        def forward(self, x):
            self.mean = 0.9 * self.mean + 0.1 * x.detach().mean(0)
            return self.lin(x)

    layer = Ema()
    x = torch.randn(4, 3, requires_grad=True)
    out = Checkpointed(layer)(x)
    once = layer.mean.clone()
    monkeypatch.setattr(recorder(), "_backward", object())  # the recompute runs inside a recorded backward
    out.sum().backward()
    assert torch.equal(layer.mean, once)


def test_a_mask_made_from_shapes_is_recomputed_by_each_block():
    """nanoGPT makes its causal mask with torch.ones(t, t) from `idx.size()` (fx cannot call
    torch.ones on a traced int: pplan records the call) and hands it to every block: each block's
    layer makes it again from the token ids (a few bytes per sample) instead of receiving it."""
    bundle = build_model("factory_models:nanogpt")
    lg = bundle.layers.graph
    assert lg.names == ("tok", "pos", "blocks.0", "blocks.1", "blocks.2", "head")
    assert all(lg.layer_inputs(i)[0] == "idx" for i in range(1, 5))  # the ids, not the mask
    assert [e[:3] for e in lg.skip_edges] == [(0, 4, 8 * 8)]
    x, y = bundle.make_batch(3, 0)
    env = bundle.layers[0](x)
    assert all(v.dtype in (torch.long, torch.float32) and v.shape[0] == 3 for v in env.values())
    torch.testing.assert_close(bundle.layers(x), bundle.layers.source(x), rtol=0, atol=0)
    build_model("factory_models:nanogpt")  # a second trace in one process (fx's wrap registry left clean)


def test_forward_arguments_with_defaults_are_traced_as_their_defaults():
    """`if mask is not None:` on an argument the example does not give: traced as its default
    (what a call with the input alone runs), leaving one input."""
    bundle = build_model("factory_models:with_defaults", input_shape=(4,))
    assert bundle.layers.graph.input_names == ("x",) and bundle.layers.graph.names == ("a", "b")
    x, _ = bundle.make_batch(3, 0)
    torch.testing.assert_close(bundle.layers(x), bundle.layers.source(x), rtol=0, atol=0)


def test_a_vit_given_another_image_size_names_the_spec_key():
    pytest.importorskip("transformers")
    with pytest.raises(ModelSpecError) as e:
        build_model(HF_SPECS["vit"], seed=0, input_shape=(3, 32, 32))  # the spec says image_size=16
    assert "doesn't match" in e.value.message
    assert "image_size is 16" in e.value.hint and "image_size=32" in e.value.hint and "--input-shape 3,16,16" in e.value.hint
    assert "hf:vit:image_size=32" in e.value.hint


@pytest.mark.parametrize("shape, hint", [
    ((16, 16, 3), "--input-shape is channels, height, width: give --input-shape 3,16,16"),  # channels last
    ((1, 16, 16), "the model takes 3-channel images: give --input-shape 3,16,16"),
])
def test_a_vit_given_other_channels_is_told_the_shape_it_takes(shape, hint):
    """A channels-last image once got "add image_size=16 ... or --input-shape 16,16,16", which fails again."""
    pytest.importorskip("transformers")
    with pytest.raises(ModelSpecError) as e:
        build_model(HF_SPECS["vit"], seed=0, input_shape=shape)
    assert e.value.hint == hint


def test_a_convnext_too_small_for_its_downsampling_is_offered_its_configs_size_only():
    """image_size is nominal for a ConvNeXt: "add image_size=8" would fail again on an 8x8 image."""
    pytest.importorskip("transformers")
    with pytest.raises(ModelSpecError) as e:
        build_model("hf:convnext:depths=1/1/1/1,hidden_sizes=8/16/32/64,num_labels=10", seed=0, input_shape=(3, 8, 8))
    assert e.value.hint == "the spec's image_size is 224 and the input is 8x8: give --input-shape 3,224,224"


def test_a_factory_key_it_has_no_parameter_for_is_refused_with_the_nearest(tmp_path, monkeypatch):
    (tmp_path / "byo_keys.py").write_text(
        "from torch import nn\n\n"
        "def build(d_in=32, d=64, n=4):\n    return nn.Sequential(nn.Linear(d_in, d), nn.Linear(d, n))\n\n"
        "def loose(**kwargs):\n    return nn.Sequential(nn.Linear(4, kwargs.get('d', 2)))\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelSpecError) as e:
        build_model("byo_keys:build:dd=3", seed=0, input_shape=(32,))
    assert "unknown key 'dd'" in e.value.message
    assert e.value.hint == "did you mean 'd'? its parameters: d_in=32, d=64, n=4"
    assert len(build_model("byo_keys:loose:d=3", seed=0, input_shape=(4,)).layers) == 1  # **kwargs takes any key
