"""Model specs are sized and checked before anything is allocated, and their errors are one line.

Every model here is tiny (at most a few MB): the size bound is tested by lowering it
(planner.models.bounds.usable_memory_bytes patched), never by building something large.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from planner.errors import ModelSpecError
from planner.models import bounds, build_model, parse_spec

MiB = 2**20
TINY_GPT2 = "hf:gpt2:n_layer=1,n_embd=64,n_head=2,vocab_size=1000,n_positions=32"
TINY_LLAMA = "hf:llama:num_hidden_layers=1,hidden_size=16,num_attention_heads=2,num_key_value_heads=1,intermediate_size=32,vocab_size=64"


def _memory(monkeypatch: pytest.MonkeyPatch, nbytes: int) -> None:
    """Make this machine look like it has `nbytes` of memory (the bound)."""
    monkeypatch.setattr(bounds, "usable_memory_bytes", lambda: nbytes)


def _numel(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("spec", [
    "gpt:layers=2,hidden=16,heads=2,seq=8,vocab=50,ffn=3",
    "resnet:stages=3,blocks=1/2/1,width=4,image=16,channels=2,classes=5",
    "resnet:stages=1,blocks=2,width=8,image=8",
    "mlp:layers=3,hidden=20,input=7,classes=4",
    "mlp:layers=1,input=7,classes=4",
    "synthetic:layers=3,param_bytes=4000/0/1002",
])
def test_builtin_sizes_count_the_parameters_the_model_has(spec):
    kind, params = parse_spec(spec)
    size = bounds.builtin_size(kind, params)
    layers = build_model(spec).layers
    assert size.parameters == _numel(layers) and size.modules == len(list(layers.modules()))
    assert size.parameter_bytes == 4 * size.parameters and size.total_bytes > size.parameter_bytes


def test_a_builtin_above_the_bound_is_refused_before_it_is_built(monkeypatch):
    _memory(monkeypatch, 4 * 2**30)  # bound 4 GiB
    spec = "gpt:layers=1,hidden=100000,vocab=100000,heads=1,seq=8"  # 140e9 parameters: 521 GiB
    with pytest.raises(ModelSpecError, match=r"140,002,300,000 parameters: 521\.5 GiB.*bound of 4\.0 GiB.*shrink layers, hidden"):
        build_model(spec)
    # each value within its own cap, their product not: a 2.8 GiB MLP above a 2 GiB bound
    spec = "mlp:layers=2,hidden=30000,input=25000,classes=2"
    assert 2.5 * 2**30 < bounds.builtin_size(*parse_spec(spec)).total_bytes < 3 * 2**30
    _memory(monkeypatch, 2 * 2**30)
    with pytest.raises(ModelSpecError, match=r"750,090,002 parameters: 2\.8 GiB.*bound of 2\.0 GiB"):
        build_model(spec)
    _memory(monkeypatch, 1 * MiB)  # 64 blocks of a few parameters: their 455 modules alone are above 1 MiB
    with pytest.raises(ModelSpecError, match=r"455 modules: 1\.8 MiB"):
        build_model("gpt:layers=64,hidden=1,heads=1,seq=1,vocab=2,ffn=1")
    _memory(monkeypatch, 64 * MiB)  # a small model within the bound builds
    assert len(build_model("gpt:layers=1,hidden=16,heads=2,seq=8,vocab=50").layers) == 3
    _memory(monkeypatch, 0)  # memory unknown (no sysconf): no bound
    assert bounds.size_bound_bytes() is None


def test_hf_size_is_counted_on_the_meta_device_before_the_weights_exist(monkeypatch):
    pytest.importorskip("transformers")
    real = _numel(build_model(TINY_GPT2, input_shape=(8,)).layers.source)  # the tied embedding once
    _memory(monkeypatch, 4 * real)  # the bound: the float32 weights alone, without their modules
    with pytest.raises(ModelSpecError, match=rf"{real:,} parameters: .*shrink the config's sizes \(num_hidden_layers, hidden_size"):
        build_model(TINY_GPT2, input_shape=(8,))


def test_an_older_hf_key_the_config_converts_is_accepted():
    # transformers reads llama's rope_theta into rope_parameters: valid in every Llama-3 config.json
    pytest.importorskip("transformers")
    bundle = build_model(f"{TINY_LLAMA},rope_theta=500000.0", input_shape=(8,))
    config = bundle.layers.source.config
    assert (config.rope_parameters or {}).get("rope_theta", getattr(config, "rope_theta", None)) == 500000.0


def test_hf_config_keys_must_be_the_model_types_own():
    pytest.importorskip("transformers")
    with pytest.raises(ModelSpecError, match=r"'hiden_size' is not a key of transformers' 'llama' config \(LlamaConfig\); did you mean 'hidden_size'"):
        build_model(f"{TINY_LLAMA},hiden_size=64", input_shape=(8,))
    with pytest.raises(ModelSpecError, match=r"'n_layers' is not a key .*did you mean 'n_layer'"):
        build_model(f"{TINY_GPT2},n_layers=1", input_shape=(8,))
    # gpt2's attribute_map makes hidden_size its n_embd (num_labels, a property of every config, is refused
    # for a language model: tests/test_hf_task_models.py)
    bundle = build_model("hf:gpt2:num_hidden_layers=1,hidden_size=16,n_head=2,vocab_size=64", input_shape=(8,))
    assert bundle.layers.source.config.n_embd == 16 and len(bundle.layers) == 3


@pytest.mark.parametrize("spec,match", [
    ("hf:gpt2:n_layer=1,n_embd=16,n_head=2,vocab_size=0", "vocab_size=0 leaves no token to draw the data from; give vocab_size=2"),
    ("hf:bert:num_hidden_layers=1,hidden_size=16,num_attention_heads=2,intermediate_size=32,vocab_size=1",
     r"vocab_size=1 leaves no token .*special tokens: 0\)"),
])
def test_hf_a_vocabulary_without_a_plain_token_is_refused(spec, match):
    pytest.importorskip("transformers")
    with pytest.raises(ModelSpecError, match=match):
        build_model(spec, input_shape=(8,))


def test_hf_unknown_model_type_names_the_nearest_few():
    pytest.importorskip("transformers")
    with pytest.raises(ModelSpecError, match=r"no model type 'lama'; did you mean 'llama'") as e:
        build_model("hf:lama")
    assert len(str(e.value)) < 400  # not every model type transformers knows


@pytest.mark.parametrize("name, family, keys", [("bert-base-uncased", "bert", "num_hidden_layers=12,hidden_size=768"),
                                               ("gpt2-medium", "gpt2", "n_layer=24,n_embd=1024"),
                                               ("gemma-2-9b", "gemma2", "num_hidden_layers=12,hidden_size=768")])
def test_hf_checkpoint_names_are_told_apart_from_model_types(name, family, keys):
    """A hub checkpoint's name once got only "no model type 'gpt2-medium'" and the list of types."""
    pytest.importorskip("transformers")
    with pytest.raises(ModelSpecError) as e:
        build_model(f"hf:{name}")
    assert f"{name!r} is a checkpoint's name, not a model type" in e.value.message and "nothing is downloaded" in e.value.message
    assert e.value.hint.startswith(f"write hf:{family} with that checkpoint's sizes as keys, e.g. hf:{family}:{keys}")


@pytest.mark.parametrize("name, nearest", [("xlm_roberta", "xlm-roberta"), ("qwen2-moe", "qwen2_moe")])
def test_hf_a_type_with_the_other_separator_is_a_misspelt_type_not_a_checkpoint(name, nearest):
    """`xlm_roberta` is xlm-roberta misspelt, not a checkpoint of another type that its name starts with."""
    pytest.importorskip("transformers")
    with pytest.raises(ModelSpecError) as e:
        build_model(f"hf:{name}")
    assert f"no model type {name!r}" in e.value.message and e.value.hint.startswith(f"did you mean {nearest!r}")


def test_hf_encoder_decoders_are_refused_as_such():
    pytest.importorskip("transformers")
    with pytest.raises(ModelSpecError, match="'t5' is an encoder-decoder model"):
        build_model("hf:t5:num_layers=1,d_model=16,d_kv=8,d_ff=32,num_heads=2,vocab_size=64")


@pytest.mark.parametrize("spec,match", [
    ("hf:swin:image_size=16,patch_size=2,embed_dim=8,depths=1/1,num_heads=1/2,window_size=4,num_labels=10",
     r"would skip the code its forward runs between its LayerNorm and its AdaptiveAvgPool1d"),
    ("hf:pvt_v2:image_size=32,hidden_sizes=8/16,depths=1/1,num_encoder_blocks=2,num_attention_heads=1/1,"
     "sr_ratios=2/1,patch_sizes=7/3,strides=4/2,mlp_ratios=2/2,num_labels=10",
     r"would lose the sizes its blocks return besides the hidden states \(integers such as 8\)"),
])
def test_hf_what_the_cut_cannot_reproduce_is_named(spec, match):
    pytest.importorskip("transformers")
    with pytest.raises(ModelSpecError, match=match):
        build_model(spec)


# factories of the tests below, found as f"{__name__}:name"

def small_seq(width: int = 8, seed: int = 0) -> nn.Sequential:
    return nn.Sequential(nn.Linear(4, width), nn.Linear(width, 2))


class _Gate(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        return h * 2 if h.sum() > 0 else -h  # control flow on a value: fx cannot trace it


class _GatedInside(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.gate, self.b = nn.Linear(4, 4), _Gate(), nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.gate(self.a(x)) + x)


class _GatedOutside(_GatedInside):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        return self.b(h if h.sum() > 0 else -h)


def gated_inside() -> nn.Module:
    return _GatedInside()


def gated_outside() -> nn.Module:
    return _GatedOutside()


def test_factory_missing_attribute_names_the_nearest_callables():
    with pytest.raises(ModelSpecError, match=r"has no attribute 'small_sq'; did you mean 'small_seq'"):
        build_model(f"{__name__}:small_sq", input_shape=(4,))


def test_factory_seed_is_not_a_spec_key():
    with pytest.raises(ModelSpecError, match=r"'seed' is not a spec key.*give --seed 5"):
        build_model(f"{__name__}:small_seq:seed=5", input_shape=(4,))
    with pytest.raises(ModelSpecError, match="given twice"):
        parse_spec(f"{__name__}:small_seq:width=3,width=4")


def test_factory_control_flow_inside_a_layer_runs_that_layer_whole():
    bundle = build_model(f"{__name__}:gated_inside", input_shape=(4,))
    assert [n for n, _ in bundle.layers.named_children()] == ["a", "gate", "b"]
    x, _ = bundle.make_batch(3, 0)
    torch.testing.assert_close(bundle.layers(x), bundle.layers.source(x), rtol=0, atol=0)
    with pytest.raises(ModelSpecError, match=r"in _GatedOutside\.forward itself: move it into a submodule") as e:
        build_model(f"{__name__}:gated_outside", input_shape=(4,))
    assert "opaque" not in str(e.value)  # no CLI option gives it
