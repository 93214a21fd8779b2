"""Parsing `--model` strings into a kind and validated parameters, without importing torch.

Grammar: `kind` or `kind:key=value,key=value` for a built-in model (every key optional),
or `package.module:factory[:key=value,...]` for a user factory (not `seed`: pplan passes
`--seed` to a factory's own seed argument). Per-layer lists use `/`
(`fwd_ms=10/20/10/5`); a scalar where a list is allowed means the same for every layer.
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass
from typing import Any, Callable

from planner.errors import ModelSpecError
from planner.limits import MAX_MODEL_SPEC_CHARS

__all__ = ["BUILTIN_KINDS", "HF_TYPES_NAMED", "hf_spelling", "INPUT_DTYPES", "KEYS", "KeySpec", "parse_spec", "builtin_layer_count",
           "describe_keys", "check_input_flags"]


@dataclass(frozen=True)
class KeySpec:
    """One parameter of a built-in model."""

    default: Any
    """Value when the key is not given."""
    kind: str
    """'int', 'float', 'bytes' (a size, units allowed), with '-list' for per-layer lists."""
    help: str
    """One line for docs and error messages."""
    minimum: float = 0
    """Smallest allowed value (inclusive)."""


KEYS: dict[str, dict[str, KeySpec]] = {
    "gpt": {
        "layers": KeySpec(12, "int", "transformer blocks (the model has layers+2 pipeline layers)", 1),
        "hidden": KeySpec(256, "int", "model width", 1),
        "heads": KeySpec(4, "int", "attention heads; must divide hidden", 1),
        "seq": KeySpec(128, "int", "sequence length in tokens", 1),
        "vocab": KeySpec(8192, "int", "vocabulary size (embedding rows and LM-head outputs)", 2),
        "ffn": KeySpec(4, "int", "MLP width as a multiple of hidden", 1),
    },
    "resnet": {
        "stages": KeySpec(4, "int", "resolution stages; each after the first halves the image and doubles the width", 1),
        "blocks": KeySpec(2, "int-list", "residual blocks per stage (one pipeline layer each); a list gives one per stage", 1),
        "width": KeySpec(32, "int", "channels of the stem and first stage", 1),
        "image": KeySpec(32, "int", "image height and width in pixels", 1),
        "channels": KeySpec(3, "int", "input image channels", 1),
        "classes": KeySpec(10, "int", "output classes", 2),
    },
    "mlp": {
        "layers": KeySpec(4, "int", "linear layers (the last one is the classifier)", 1),
        "hidden": KeySpec(1024, "int", "width of the hidden layers", 1),
        "input": KeySpec(784, "int", "input features per sample", 1),
        "classes": KeySpec(10, "int", "output classes", 2),
    },
    "synthetic": {
        "layers": KeySpec(4, "int", "pipeline layers", 1),
        "fwd_ms": KeySpec(10.0, "float-list", "forward time per micro-batch, ms (slept)"),
        "bwd_ms": KeySpec(20.0, "float-list", "backward time per micro-batch, ms (slept)"),
        "fwd_ms_per_sample": KeySpec(0.0, "float-list", "extra forward ms per sample of the micro-batch"),
        "bwd_ms_per_sample": KeySpec(0.0, "float-list", "extra backward ms per sample of the micro-batch"),
        "weight_frac": KeySpec(0.5, "float-list", "share of the backward that is the weight gradient (zero-bubble W)"),
        "param_bytes": KeySpec(1_000_000, "bytes-list", "parameter bytes of each layer (float32)"),
        "act_bytes": KeySpec(1_000_000, "bytes-list", "activation bytes kept for backward, per sample"),
        "hidden": KeySpec(256, "int", "features per sample passed between layers (float32)", 1),
    },
}
BUILTIN_KINDS = tuple(KEYS)
# --input-dtype of a plain factory Sequential (planner.models.factory); profiles record it.
INPUT_DTYPES = ("float", "long")
# Values beyond these are typos, and would make `build_model` allocate absurd amounts.
_MAX_INT = 10**7
_MAX_MS = 3_600_000.0
_MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")  # a dotted Python name


def describe_keys(kind: str) -> str:
    """'layers=12, hidden=256, ...': the keys of a built-in kind with their defaults."""
    return ", ".join(f"{k}={_show(s.default)}" for k, s in KEYS[kind].items())


def _show(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def parse_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """`'gpt:layers=4'` -> `('gpt', {all keys with defaults filled})`.

    A factory spec returns `('factory', {'module': ..., 'callable': ..., 'kwargs': {...}})`.
    Raises ModelSpecError naming the bad key or value and listing the valid keys.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ModelSpecError("empty --model", f"give {_KINDS_IN_WORDS}")
    if len(spec) > MAX_MODEL_SPEC_CHARS:
        raise ModelSpecError(f"--model is {len(spec):,} characters long, more than {MAX_MODEL_SPEC_CHARS:,}",
                             "a synthetic model of that many layers is better written as a factory (module:callable)")
    text = spec.strip()
    kind, _, rest = text.partition(":")
    kind = kind.strip()
    if kind in KEYS:
        return kind, _parse_builtin(kind, rest, text)
    if kind == "hf":
        return "hf", _parse_hf(rest, text)
    parts = text.split(":", 2)
    if len(parts) >= 2 and _MODULE.fullmatch(parts[0]) and _MODULE.fullmatch(parts[1]):
        kwargs = _parse_kwargs(parts[2], text) if len(parts) == 3 else {}
        return "factory", {"module": parts[0], "callable": parts[1], "kwargs": kwargs}
    raise ModelSpecError(f"unknown model {text!r}", f"{_guess(kind, text)}use {_KINDS_IN_WORDS}")


_KINDS_IN_WORDS = (f"a built-in ({', '.join(BUILTIN_KINDS)}; e.g. gpt:layers=4), a Hugging Face model "
                   "hf:MODEL_TYPE[:config_key=value,...] (e.g. hf:gpt2:n_layer=4), or package.module:factory returning "
                   "your nn.Module (an nn.Sequential or any module torch.fx can trace; docs/models.md)")
"""Every kind of --model, for the hint of one that names none of them."""
HF_TYPES_NAMED = ("gpt2", "llama", "mistral", "qwen2", "gpt_neox", "phi", "gemma2", "falcon", "bloom", "bert",
                  "roberta", "albert", "vit", "deit", "convnext", "regnet", "mobilenet_v2")
"""Hugging Face model types the README names (transformers knows many more): a spec that starts
with one of them (`llama:...`) is taken for that model, and `hf:` is suggested."""


def hf_spelling(kind: str, spec: str) -> str | None:
    """`spec` with the hf: prefix when its `kind` is a Hugging Face type the README names
    ('llama:num_hidden_layers=2' -> 'hf:llama:num_hidden_layers=2'), else None."""
    if kind.lower() not in HF_TYPES_NAMED:
        return None
    return "hf:" + kind.lower() + spec.strip()[len(kind):]


def _guess(kind: str, spec: str) -> str:
    """'did you mean ...? ' for an unknown model kind: the spec with `hf:` for a Hugging Face type
    the README names, else the nearest built-in; '' when nothing is close."""
    if (hf := hf_spelling(kind, spec)) is not None:
        return f"did you mean {hf!r} (Hugging Face models take the hf: prefix)? "
    close = difflib.get_close_matches(kind, BUILTIN_KINDS, n=1)
    return f"did you mean {close[0]!r}? " if close else ""


def _parse_hf(rest: str, spec: str) -> dict[str, Any]:
    """`hf:MODEL_TYPE[:config_key=value,...]` -> {'model_type': ..., 'config': {...}}; `/` makes a list."""
    model_type, _, keys = rest.partition(":")
    model_type = model_type.strip()
    if not re.fullmatch(r"[A-Za-z][\w-]*", model_type):
        raise ModelSpecError(f"model {spec!r}: {model_type!r} is not a Hugging Face model type",
                             "write hf:MODEL_TYPE[:key=value,...], e.g. hf:gpt2:n_layer=4,n_embd=128,n_head=4")
    config: dict[str, Any] = {}
    for key, value in _pairs(keys, spec):
        if not key.isidentifier():
            raise ModelSpecError(f"model {spec!r}: {key!r} is not a config key")
        if key in config:
            raise ModelSpecError(f"model {spec!r}: key {key!r} given twice")
        items = [_literal(v.strip()) for v in value.split("/")]
        config[key] = items if len(items) > 1 else items[0]
    return {"model_type": model_type, "config": config}


def _pairs(rest: str, spec: str) -> list[tuple[str, str]]:
    pairs = []
    for item in rest.split(","):
        if not item.strip():
            continue
        key, eq, value = item.partition("=")
        if not eq or not key.strip() or not value.strip():
            example = "hf:gpt2:n_layer=4,n_embd=128" if spec.startswith("hf:") else "gpt:layers=4,hidden=256"
            raise ModelSpecError(f"model {spec!r}: {item.strip()!r} is not key=value", f"write it like {example}")
        pairs.append((key.strip(), value.strip()))
    return pairs


def _parse_builtin(kind: str, rest: str, spec: str) -> dict[str, Any]:
    keys = KEYS[kind]
    params = {k: s.default for k, s in keys.items()}
    seen: set[str] = set()
    for key, value in _pairs(rest, spec):
        if key not in keys:
            raise ModelSpecError(f"model {spec!r}: unknown key {key!r} for {kind}", f"valid keys: {describe_keys(kind)}")
        if key in seen:
            raise ModelSpecError(f"model {spec!r}: key {key!r} given twice")
        seen.add(key)
        params[key] = _parse_value(key, value, keys[key], spec)
    _check_builtin(kind, params, spec)
    return params


def _parse_value(key: str, text: str, ks: KeySpec, spec: str) -> Any:
    base = ks.kind.removesuffix("-list")
    items = text.split("/")
    if len(items) > 1 and not ks.kind.endswith("-list"):
        raise ModelSpecError(f"model {spec!r}: {key}={text!r} is a list but {key} takes one value")
    values = [_scalar(key, item.strip(), base, ks, spec) for item in items]
    return tuple(values) if len(values) > 1 else values[0]


def _scalar(key: str, text: str, base: str, ks: KeySpec, spec: str) -> float | int:
    what = {"int": "an integer", "float": "a number", "bytes": "a size in bytes (e.g. 1e6 or 4MB)"}[base]
    try:
        if base == "bytes":
            value: float = 0 if _is_zero(text) else _parse_size(text, key)
        else:
            value = float(text)
    except (ValueError, ModelSpecError):
        raise ModelSpecError(f"model {spec!r}: {key}={text!r} is not {what}", f"{key}: {ks.help}") from None
    if not math.isfinite(value):
        raise ModelSpecError(f"model {spec!r}: {key}={text!r} is not finite")
    if base in ("int", "bytes"):
        if value != int(value):
            raise ModelSpecError(f"model {spec!r}: {key}={text!r} must be a whole number")
        value = int(value)
    if value < ks.minimum:
        raise ModelSpecError(f"model {spec!r}: {key}={text} is below {_show(ks.minimum)}", f"{key}: {ks.help}")
    limit = _MAX_MS if base == "float" else _MAX_INT if base == "int" else 2**40
    if value > limit:
        raise ModelSpecError(f"model {spec!r}: {key}={text} is too large (limit {limit:g})")
    return value


def _is_zero(text: str) -> bool:
    try:
        return float(text) == 0
    except ValueError:
        return False


def _parse_size(text: str, key: str) -> int:
    from planner.errors import PplanError
    from planner.units import parse_bytes

    try:
        return parse_bytes(text, key)
    except PplanError:
        raise ValueError(text) from None


def _check_builtin(kind: str, p: dict[str, Any], spec: str) -> None:
    if kind == "gpt" and p["hidden"] % p["heads"]:
        raise ModelSpecError(f"model {spec!r}: heads={p['heads']} does not divide hidden={p['hidden']}", "pick hidden as a multiple of heads, e.g. hidden=256,heads=4")
    if kind == "resnet":
        p["blocks"] = _per_layer(p, "blocks", p["stages"], spec, "stages")
        if p["image"] % (2 ** (p["stages"] - 1)):
            raise ModelSpecError(f"model {spec!r}: image={p['image']} cannot be halved {p['stages'] - 1} times", f"use an image size divisible by {2 ** (p['stages'] - 1)} or fewer stages")
    if kind == "synthetic":
        for key, ks in KEYS["synthetic"].items():
            if ks.kind.endswith("-list"):
                p[key] = _per_layer(p, key, p["layers"], spec, "layers")
        bad = [f for f in p["weight_frac"] if f > 1]
        if bad:
            raise ModelSpecError(f"model {spec!r}: weight_frac={bad[0]:g} is above 1", "it is the share of the backward spent on weight gradients, 0..1")


def _per_layer(p: dict[str, Any], key: str, n: int, spec: str, count_key: str) -> tuple:
    value = p[key]
    if not isinstance(value, tuple):
        return (value,) * n
    if len(value) != n:
        raise ModelSpecError(f"model {spec!r}: {key} lists {len(value)} values but {count_key}={n}", f"give one value per {count_key[:-1]} separated by '/', or a single value for all")
    return value


def _parse_kwargs(rest: str, spec: str) -> dict[str, Any]:
    """Factory keyword arguments: ints, floats, true/false, else strings."""
    out: dict[str, Any] = {}
    for key, value in _pairs(rest, spec):
        if not key.isidentifier():
            raise ModelSpecError(f"model {spec!r}: {key!r} is not a valid keyword argument name")
        if key == "seed":  # pplan passes --seed to a factory's seed argument: a second one would be overridden
            raise ModelSpecError(f"model {spec!r}: 'seed' is not a spec key; pplan passes --seed to the factory's seed argument",
                                 f"drop seed={value} from the spec and give --seed {value}")
        if key in out:
            raise ModelSpecError(f"model {spec!r}: key {key!r} given twice")
        out[key] = _literal(value)
    return out


def _literal(text: str) -> Any:
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


_COUNTS: dict[str, Callable[[dict[str, Any]], int]] = {
    "gpt": lambda p: p["layers"] + 2,
    "resnet": lambda p: 2 + sum(p["blocks"]),
    "mlp": lambda p: p["layers"],
    "synthetic": lambda p: p["layers"],
}


def builtin_layer_count(spec: str) -> int | None:
    """Number of pipeline layers of a built-in `spec`, without building it; None for the others
    (factories and `hf:` models must be built: planner.models.build.layer_count)."""
    kind, params = parse_spec(spec)
    return _COUNTS[kind](params) if kind in _COUNTS else None


_HF_INPUT_FLAGS = ("--input-shape",)
"""The input flags an `hf:` model reads: its sequence length or image shape. Its token range is the
config's vocab_size and its input dtype follows from its task, so --vocab and --input-dtype are not."""


def check_input_flags(spec: str, *, input_shape: tuple[int, ...] | None = None, input_dtype: str | None = None,
                      vocab: int | None = None) -> str:
    """Parse `spec` and refuse the input flags (`--input-shape`, `--input-dtype`, `--vocab`, None
    when not given) that its kind would ignore; returns the kind.

    Only a plain `module:factory` Sequential reads all three. A built-in model takes every size
    from its spec and an `hf:` model its vocabulary from its config: a flag they do not read
    would silently run another model than the one the user described. `pplan profile` and
    `pplan run` (planner.execute.preflight) both call this before measuring or launching.
    """
    kind, _ = parse_spec(spec)
    given = [flag for flag, value in (("--input-shape", input_shape), ("--input-dtype", input_dtype), ("--vocab", vocab))
             if value is not None]
    if kind == "factory":
        return kind
    if kind == "hf":
        ignored = [flag for flag in given if flag not in _HF_INPUT_FLAGS]
        if ignored:
            raise ModelSpecError(f"{', '.join(ignored)} given for hf: model {spec!r}, which takes its vocabulary "
                                 "(vocab_size) from its config and its input dtype from its task",
                                 f"drop {', '.join(ignored)}; set vocab_size=N in the spec (--input-shape gives the sequence length or image shape)")
        return kind
    if given:
        raise ModelSpecError(f"{', '.join(given)} given for built-in {kind} model {spec!r}: a built-in takes its input "
                             "sizes from its spec (--input-shape, --input-dtype and --vocab describe a module:factory model's input)",
                             f"drop {', '.join(given)}; set the sizes in the spec, e.g. {kind}:{describe_keys(kind).replace(', ', ',')}")
    return kind
