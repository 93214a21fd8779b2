"""Built-in models, spec parsing and the module:factory protocol."""

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from planner.errors import ModelSpecError
from planner.models import ModelBundle, build_model, layer_count, parse_spec
from planner.profiling.saved import SavedTensors

from helpers.models import weights_digest

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
SMALL = {
    "gpt": "gpt:layers=2,hidden=16,heads=2,seq=8,vocab=50",
    "resnet": "resnet:stages=2,blocks=1/2,width=4,image=8,classes=3",
    "mlp": "mlp:layers=3,hidden=8,input=5,classes=3",
    "synthetic": "synthetic:layers=3,fwd_ms=0,bwd_ms=0,param_bytes=400/0/4000,act_bytes=100,hidden=6",
}


@pytest.fixture(autouse=True)
def _factories_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))


def test_parse_spec_fills_defaults_and_lists():
    kind, p = parse_spec("gpt:layers=4")
    assert kind == "gpt" and p == {"layers": 4, "hidden": 256, "heads": 4, "seq": 128, "vocab": 8192, "ffn": 4}
    kind, p = parse_spec("synthetic:layers=4,fwd_ms=10/20/10/5,bwd_ms=20,param_bytes=1e6,act_bytes=4MB")
    assert p["fwd_ms"] == (10, 20, 10, 5) and p["bwd_ms"] == (20,) * 4
    assert p["param_bytes"] == (1_000_000,) * 4 and p["act_bytes"] == (4_000_000,) * 4
    assert parse_spec("resnet:stages=3,blocks=1/2/3")[1]["blocks"] == (1, 2, 3)
    assert parse_spec(" mlp ")[0] == "mlp"


def test_parse_factory_spec_with_kwargs():
    kind, p = parse_spec("pkg.mod:make:hidden=8,rate=0.5,name=x,flag=true")
    assert kind == "factory"
    assert p == {"module": "pkg.mod", "callable": "make", "kwargs": {"hidden": 8, "rate": 0.5, "name": "x", "flag": True}}


@pytest.mark.parametrize("spec, words", [
    ("", ["empty"]),
    ("gtp", ["unknown model", "gpt"]),
    ("gpt:layer=3", ["'layer'", "valid keys", "layers=12", "vocab=8192"]),
    ("gpt:layers=abc", ["layers='abc'", "integer"]),
    ("gpt:layers=0", ["layers=0", "below 1"]),
    ("gpt:layers=2.5", ["whole number"]),
    ("gpt:layers=4,layers=5", ["twice"]),
    ("gpt:hidden=100,heads=3", ["heads=3", "hidden=100"]),
    ("gpt:layers", ["not key=value"]),
    ("gpt:vocab=inf", ["vocab"]),
    ("gpt:layers=1/2", ["list"]),
    ("synthetic:layers=3,fwd_ms=1/2", ["fwd_ms", "3"]),
    ("synthetic:fwd_ms=-1", ["fwd_ms=-1"]),
    ("synthetic:param_bytes=12XB", ["param_bytes"]),
    ("synthetic:weight_frac=1.5", ["weight_frac"]),
    ("resnet:image=30,stages=3", ["image=30"]),
    ("resnet:stages=2,blocks=1/2/3", ["blocks", "stages=2"]),
    ("pkg.mod:make:oops", ["not key=value"]),
])
def test_bad_specs_give_one_line_errors(spec, words):
    with pytest.raises(ModelSpecError) as info:
        parse_spec(spec)
    message = info.value.one_line()
    assert "\n" not in message
    for word in words:
        assert word in message


def test_parse_spec_and_layer_count_do_not_import_torch():
    code = (
        "import sys; import planner.models as m; m.parse_spec('gpt:layers=3');"
        "assert m.layer_count('gpt:layers=3') == 5; assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


@pytest.mark.parametrize("kind", sorted(SMALL))
def test_builtin_models_build_train_and_are_consistent(kind):
    spec = SMALL[kind]
    bundle = build_model(spec, seed=1)
    assert isinstance(bundle, ModelBundle) and bundle.spec == spec
    assert len(bundle.layers) == layer_count(spec)
    names = [n for n, _ in bundle.layers.named_children()]
    assert all(not n.isdigit() for n in names) and len(set(names)) == len(names)
    x, y = bundle.make_batch(3, seed=5)
    x2, y2 = bundle.make_batch(3, seed=5)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    assert not torch.equal(x, bundle.make_batch(3, seed=6)[0])
    assert bundle.input_bytes_per_sample == x.numel() * x.element_size() // 3
    loss = bundle.loss_fn(bundle.layers(x), y)
    assert loss.dim() == 0 and math.isfinite(loss.item())
    loss.backward()
    assert all(p.grad is not None for p in bundle.layers.parameters())


def test_layer_names_and_counts():
    names = lambda spec: [n for n, _ in build_model(spec).layers.named_children()]  # noqa: E731
    assert names(SMALL["gpt"]) == ["embed", "block0", "block1", "norm_head"]
    assert names(SMALL["resnet"]) == ["stem", "s0b0", "s1b0", "s1b1", "pool_head"]
    assert names(SMALL["mlp"]) == ["fc0", "fc1", "head"]
    assert names(SMALL["synthetic"]) == ["layer0", "layer1", "layer2"]
    assert layer_count("gpt:layers=12") == 14 and layer_count("resnet") == 10 and layer_count("mlp:layers=6") == 6


def test_weights_are_deterministic_across_builds_and_processes():
    spec = SMALL["gpt"]
    state = torch.random.get_rng_state()
    a, b = build_model(spec, seed=3), build_model(spec, seed=3)
    assert torch.equal(state, torch.random.get_rng_state()), "building must not disturb the caller's RNG"
    assert weights_digest(a) == weights_digest(b) != weights_digest(build_model(spec, seed=4))
    code = (
        "import sys; sys.path.insert(0, %r); from helpers.models import weights_digest; from planner.models import build_model;"
        "print(weights_digest(build_model(%r, seed=3)))" % (str(TESTS), spec)
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == weights_digest(a)


def test_gpt_large_vocab_puts_parameters_in_embedding_and_head():
    layers = build_model("gpt:layers=2,hidden=64,heads=2,seq=16,vocab=32000").layers
    sizes = {n: sum(p.numel() for p in m.parameters()) for n, m in layers.named_children()}
    assert sizes["embed"] + sizes["norm_head"] > 0.9 * sum(sizes.values())


def _saved_bytes(layer, x):
    with SavedTensors(exclude=[*layer.parameters()]) as saved:
        y = layer(x)
    return saved.total_bytes, y


def test_resnet_early_layers_hold_activations_late_layers_hold_parameters():
    layers = build_model("resnet:stages=4,blocks=1,width=8,image=32").layers
    x, _ = build_model("resnet:stages=4,blocks=1,width=8,image=32").make_batch(2, 0)
    acts, params = {}, {}
    for name, layer in layers.named_children():
        acts[name], x = _saved_bytes(layer, x.detach().requires_grad_())
        params[name] = sum(p.numel() * 4 for p in layer.parameters())
    assert acts["s0b0"] > 4 * acts["s3b0"]  # each stage halves the activation bytes
    assert params["s3b0"] > 20 * params["s0b0"]


def test_synthetic_layers_have_exact_parameter_and_activation_bytes():
    bundle = build_model("synthetic:layers=2,fwd_ms=0,bwd_ms=0,param_bytes=4000/0,act_bytes=1000,hidden=8")
    first, second = bundle.layers
    assert sum(p.numel() * p.element_size() for p in first.parameters()) == 4000
    assert list(second.parameters()) == []
    x = torch.randn(5, 8, requires_grad=True)
    for layer in (first, second):
        saved, y = _saved_bytes(layer, x)
        assert saved == 5 * 1000  # act_bytes is per sample, and nothing else is saved
        assert y.shape == (5, 8)


def test_factory_plain_sequential_uses_input_shape():
    b = build_model("factory_models:plain:hidden=16", input_shape=(4,))
    assert [n for n, _ in b.layers.named_children()] == ["fc0", "act", "fc1"]
    assert b.layers.fc0.out_features == 16 and b.input_bytes_per_sample == 16
    x, y = b.make_batch(3, 0)
    assert x.shape == (3, 4) and y.shape == (3, 2) and torch.equal(x, b.make_batch(3, 0)[0])
    assert b.loss_fn(b.layers(x), y).dim() == 0
    assert weights_digest(b) == weights_digest(build_model("factory_models:plain:hidden=16", input_shape=(4,)))


def test_factory_long_input_with_vocab():
    b = build_model("factory_models:tokens:vocab=7", input_shape=(6,), input_dtype="long", vocab=7)
    x, _ = b.make_batch(4, 1)
    assert x.dtype == torch.long and int(x.max()) < 7 and b.input_bytes_per_sample == 48


def test_factory_with_own_data_and_loss_and_bundle():
    b = build_model("factory_models:with_data")
    x, y = b.make_batch(2, 0)
    assert x.shape == (2, 3) and b.input_bytes_per_sample == 12 and b.loss_fn(b.layers(x), y).dim() == 0
    assert build_model("factory_models:bundle").spec == "custom"


@pytest.mark.parametrize("spec, kwargs, words", [
    ("no_such_module_xyz:make", {}, ["cannot import", "no_such_module_xyz"]),
    ("factory_models:nope", {}, ["no attribute", "nope"]),
    ("factory_models:NOT_CALLABLE", {}, ["not callable"]),
    ("factory_models:not_a_model", {}, ["returned int"]),
    ("factory_models:empty", {}, ["non-empty"]),
    ("factory_models:broken", {}, ["ValueError", "factory exploded"]),
    ("factory_models:plain:bogus=1", {}, ["bogus"]),
    ("factory_models:plain", {}, ["--input-shape"]),
    ("factory_models:plain", {"input_shape": (5,)}, ["fails on an input of shape (1, 5)"]),
    ("factory_models:plain", {"input_shape": (4,), "input_dtype": "long"}, ["--vocab"]),
    ("factory_models:plain", {"input_shape": (4,), "input_dtype": "half"}, ["half"]),
])
def test_factory_errors_are_one_line(spec, kwargs, words):
    with pytest.raises(ModelSpecError) as info:
        build_model(spec, **kwargs)
    message = info.value.one_line()
    assert "\n" not in message
    for word in words:
        assert word in message


def test_bad_seed():
    with pytest.raises(ModelSpecError, match="seed"):
        build_model("mlp", seed=-1)


def test_every_key_is_documented_with_its_default():
    from planner.models.spec import KEYS

    doc = (ROOT / "docs" / "models.md").read_text(encoding="utf-8")
    for kind, keys in KEYS.items():
        section = doc.split(f"## `{kind}`", 1)[1].split("\n## ", 1)[0]
        for key, ks in keys.items():
            default = f"{ks.default:g}" if isinstance(ks.default, float) else str(ks.default)
            assert f"| `{key}` | {default} |" in section, (kind, key, default)
