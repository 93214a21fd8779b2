"""The config, task and size of an `hf:` model, each checked before a weight is allocated.

planner.models.hf cuts the model this module builds. Checked here, each refused in one line:
a model type transformers does not know (the nearest few named), a config key that is not one
of the type's own (an unknown keyword would otherwise become a silent attribute, and a typo'd
size key would build the full default model: Llama's 6.7B parameters), an encoder-decoder or a
type without a task pplan trains, a vocabulary with no token to draw, and a model larger than
the bound of planner.models.bounds, counted on torch's meta device (shapes, no storage).
"""

from __future__ import annotations

import copy
import difflib
import inspect
from typing import Any

import torch
from torch import nn

from planner.errors import ModelSpecError
from planner.models.bounds import ModelSize, check_model_size
from planner.torch_compat import private_attr

__all__ = ["transformers_module", "make_config", "task_of", "from_config", "model_mapping", "token_ids", "first_plain_token", "check_hf_size",
           "image_input_hint"]

_COMMON_TYPES = "gpt2, llama, mistral, qwen2, bert, roberta, vit, resnet, convnext (docs/models.md)"
_SIZE_KEYS = ("num_hidden_layers", "hidden_size", "intermediate_size", "vocab_size", "max_position_embeddings",
              "depths", "hidden_sizes", "embed_dim", "image_size")
"""Config keys that size a model, named in the hint of one refused as too large (those its config has)."""
_BLOCK_MODULES = 8
"""A floor on the modules of one transformer block (attention, its projections, MLP, norms),
checked against the bound before the meta build creates them."""


def transformers_module() -> Any:
    """The transformers package, or a one-line error saying how to install it."""
    try:
        import transformers
    except ImportError:
        raise ModelSpecError("hf: models need the transformers package", "pip install -e '.[hf]' (or pip install transformers)") from None
    return transformers


# A checkpoint's depth and width as its family's config names them, for make_config's hint on a
# checkpoint name (most families use transformers' common names; gpt2 keeps its own).
_CHECKPOINT_SIZES = {"gpt2": "n_layer=24,n_embd=1024"}


def _checkpoint_family(name: str, known: list[str]) -> str | None:
    """The model type a hub checkpoint's name starts with (`bert-base-uncased` -> bert,
    `gpt2-medium` -> gpt2, `gemma-2-9b` -> gemma2), or None. Separators are ignored, so a type
    written with the other separator (`xlm_roberta`, `qwen2-moe`) is a misspelt type, left to the
    nearest-name hint, not a checkpoint of a shorter type."""
    def bare(text: str) -> str:
        return "".join(ch for ch in text.lower() if ch not in "-_.")

    if not any(sep in name for sep in "-_") or any(bare(t) == bare(name) for t in known):
        return None
    families = [t for t in known if bare(name).startswith(bare(t))]
    return max(families, key=lambda t: len(bare(t))) if families else None


def make_config(model_type: str, given: dict[str, Any], spec: str) -> Any:
    """transformers' config of `model_type` with the spec's keys, dropout off, token ids inside
    the vocabulary and no cache; an unknown type or key refused naming the nearest ones."""
    tf = transformers_module()
    known = list(tf.CONFIG_MAPPING.keys())
    if model_type not in known:
        family = _checkpoint_family(model_type, known)
        if family:  # a hub checkpoint's name: nothing is downloaded, the model is built from a config
            raise ModelSpecError(f"model {spec!r}: {model_type!r} is a checkpoint's name, not a model type; pplan builds "
                                 "hf: models from a config (nothing is downloaded)",
                                 f"write hf:{family} with that checkpoint's sizes as keys, e.g. hf:{family}:"
                                 f"{_CHECKPOINT_SIZES.get(family, 'num_hidden_layers=12,hidden_size=768')} (docs/models.md)")
        close = difflib.get_close_matches(model_type, known, n=3)
        maybe = f"did you mean {', '.join(map(repr, close))}? " if close else ""
        raise ModelSpecError(f"model {spec!r}: transformers has no model type {model_type!r}",
                             f"{maybe}model types are transformers' names: {_COMMON_TYPES}")
    _check_label_count(given, spec)  # before any config is made: each one builds its label table
    _check_keys(tf, model_type, given, spec)
    try:
        cfg = tf.AutoConfig.for_model(model_type, **given)
    except Exception as e:  # noqa: BLE001 - a value the config class refuses: one line
        raise ModelSpecError(f"model {spec!r}: transformers cannot make a {model_type!r} config: {type(e).__name__}: {' '.join(str(e).split())[:300]}",
                             "check the values against transformers' config class for this model type") from None
    for key, value in list(vars(cfg).items()):
        if key in given or isinstance(value, bool) or not isinstance(value, float):
            continue
        # every random drop: dropout, LayerDrop, stochastic depth (drop path / drop connect)
        if "dropout" in key or key.endswith(("pdrop", "layerdrop", "drop_path_rate", "drop_connect_rate", "drop_rate")):
            setattr(cfg, key, 0.0)
    vocab = getattr(cfg, "vocab_size", None)
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = getattr(cfg, key, None)
        if key in given or not vocab:
            continue
        if isinstance(value, int) and value >= vocab:
            setattr(cfg, key, None)
        elif isinstance(value, (list, tuple)):  # GLM lists several end tokens: keep those inside the vocabulary
            kept = [v for v in value if not isinstance(v, int) or v < vocab]
            setattr(cfg, key, kept or None)
    if hasattr(cfg, "use_cache"):
        cfg.use_cache = False
    return cfg


MAX_LABELS = 100_000
"""Most classes an hf: spec may ask for: a config builds id2label and label2id with an entry per
label as it is made, so num_labels=10**8 filled 20 GB before any other check could refuse it."""


def _check_label_count(given: dict[str, Any], spec: str) -> None:
    """Refuse a num_labels beyond MAX_LABELS before transformers sees it."""
    labels = given.get("num_labels")
    if isinstance(labels, int) and not isinstance(labels, bool) and labels > MAX_LABELS:
        raise ModelSpecError(f"model {spec!r}: num_labels={labels:,} is more than {MAX_LABELS:,} classes",
                             f"give num_labels of at most {MAX_LABELS:,} (ImageNet-21k has 21,843)")


def _config_keys(default: Any) -> set[str]:
    """What a config of this class accepts: its attributes, their attribute_map aliases (gpt2's
    hidden_size for n_embd), its properties (num_labels) and its constructor's named arguments."""
    keys = set(vars(default)) | set(getattr(default, "attribute_map", None) or {})
    for klass in type(default).__mro__:
        keys |= {name for name, value in vars(klass).items() if isinstance(value, property)}
        try:
            params = inspect.signature(klass.__init__).parameters.values()
        except (TypeError, ValueError):
            continue
        keys |= {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return {k for k in keys if not k.startswith("_") and k != "self"}


def _stored_verbatim(tf: Any, model_type: str, key: str, value: Any) -> bool:
    """Whether the config class keeps `key` only as a loose attribute holding `value` (what it
    does with a key it does not know, a typo), rather than reading it: transformers converts some
    older keys into newer ones (llama's rope_theta into rope_parameters), which are valid."""
    try:
        cfg = tf.AutoConfig.for_model(model_type, **{key: value})
    except Exception:  # noqa: BLE001 - the full build reports the config's own error
        return False
    return key in vars(cfg) and vars(cfg)[key] == value


def _nested_keys(value: Any, depth: int = 3) -> set[str]:
    """The names inside a config's dict-valued attributes (llama's rope_parameters holds rope_theta;
    gemma3's nests one dict per attention type): where transformers files the older keys it converts."""
    if depth == 0 or not isinstance(value, dict):
        return set()
    found = {k for k in value if isinstance(k, str) and k.isidentifier()}
    for inner in value.values():
        found |= _nested_keys(inner, depth - 1)
    return found


def _suggestions(tf: Any, model_type: str, default: Any, keys: set[str], key: str, value: Any) -> list[str]:
    """The nearest few accepted keys to a refused `key`: the config's own, and the converted ones
    (found inside its dicts, kept only where the config reads them rather than storing them loose)."""
    converted = set().union(*(_nested_keys(v) for v in vars(default).values())) - keys
    close = difflib.get_close_matches(key, sorted(keys | converted), n=3)
    return [name for name in close if name in keys or not _stored_verbatim(tf, model_type, name, value)]


def _check_keys(tf: Any, model_type: str, given: dict[str, Any], spec: str) -> None:
    default = tf.AutoConfig.for_model(model_type)
    keys = _config_keys(default)
    for key, value in given.items():
        if key not in keys and _stored_verbatim(tf, model_type, key, value):
            close = _suggestions(tf, model_type, default, keys, key, value)
            maybe = f"did you mean {', '.join(map(repr, close))}? " if close else ""
            raise ModelSpecError(f"model {spec!r}: {key!r} is not a key of transformers' {model_type!r} config ({type(default).__name__})",
                                 f"{maybe}the keys are {type(default).__name__}'s attributes, or older ones it converts")


def task_of(tf: Any, cfg: Any, model_type: str, spec: str) -> tuple[str, Any]:
    """The task pplan trains the config's model for ("masked", "causal" or "image") and
    transformers' auto class of that task; a seq2seq type, or one with none of them, is refused."""
    if getattr(cfg, "is_encoder_decoder", False):  # before the task: BART is registered as a masked LM, as its whole seq2seq model
        raise ModelSpecError(f"model {spec!r}: {model_type!r} is an encoder-decoder model (two stacks of blocks, the decoder's reading "
                             "the encoder's output), not a causal LM, masked LM or image classifier with the one stack pplan cuts",
                             "wrap its submodules in a `module:factory` (docs/models.md, 'Encoder-decoder models', "
                             "shows BART's), or use a decoder-only or encoder-only family")
    # masked first: BERT is also registered as a causal LM (its decoder variant)
    tasks = (("masked", tf.AutoModelForMaskedLM), ("causal", tf.AutoModelForCausalLM),
             ("image", tf.AutoModelForImageClassification))
    task = next((name for name, auto in tasks if type(cfg) in model_mapping(auto)), None)
    if task is None:
        raise ModelSpecError(f"model {spec!r}: {model_type!r} is not a causal LM, masked LM or image classifier in transformers",
                             "supported: causal LMs (gpt2, llama, ...), masked LMs (bert, ...), image classifiers (vit, resnet, ...); see docs/models.md")
    return task, dict(tasks)[task]


def model_mapping(auto: Any) -> Any:
    """transformers' private config class -> model class(es) mapping of an auto class (`_model_mapping`)."""
    return private_attr(auto, "_model_mapping", "transformers")


def from_config(auto: Any, cfg: Any, task: str, spec: str) -> nn.Module:
    """The task model of `cfg`, on the current default device (random weights, or meta)."""
    classes = model_mapping(auto)[type(cfg)]
    if isinstance(classes, (tuple, list)) and not getattr(cfg, "architectures", None):
        cfg.architectures = [classes[0].__name__]  # DeiT has two image classifiers: the auto class picks by this
    try:
        if task == "image":
            return auto.from_config(cfg)
        try:
            return auto.from_config(cfg, attn_implementation="sdpa")
        except (ValueError, ImportError):  # a family without SDPA (Gemma 2, Bloom): its eager attention
            return auto.from_config(cfg, attn_implementation="eager")
    except Exception as e:  # noqa: BLE001 - inconsistent config values: one line
        raise ModelSpecError(f"model {spec!r}: building it failed: {type(e).__name__}: {' '.join(str(e).split())[:300]}",
                             "check the config keys against transformers' config class for this model type") from None


def token_ids(cfg: Any) -> list[int]:
    """The config's bos, eos and pad token ids (each an int, a list of ints, or None)."""
    out: list[int] = []
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = getattr(cfg, key, None)
        out += [v for v in (value if isinstance(value, (list, tuple)) else [value]) if isinstance(v, int)]
    return out


def first_plain_token(cfg: Any, spec: str) -> int:
    """The smallest token id that is no special token (the probe's filler: no padding for a model
    to mask); a vocabulary without one is refused, since no batch could be drawn from it."""
    vocab = getattr(cfg, "vocab_size", None)
    if not isinstance(vocab, int):
        vocab = 0
    special = {t for t in token_ids(cfg) if 0 <= t < vocab}
    # at most len(special) + 1 candidates: one of them is not special
    token = next((t for t in range(min(vocab, len(special) + 1)) if t not in special), None)
    if token is None:
        named = f" (the config's special tokens: {', '.join(map(str, sorted(special)))})" if special else ""
        raise ModelSpecError(f"model {spec!r}: vocab_size={vocab} leaves no token to draw the data from{named}",
                             f"give vocab_size={max(2, len(special) + 1)} or more")
    return token


def check_hf_size(auto: Any, cfg: Any, task: str, spec: str, sample_activation_bytes: int) -> None:
    """Build the model on the meta device (no storage, the random state untouched) and refuse it,
    before its weights exist, when it exceeds planner.models.bounds' bound. Its layer count is
    checked first: the meta model's modules are real Python objects."""
    keys = [k for k in _SIZE_KEYS if getattr(cfg, k, None) is not None]
    hint = (f"shrink the config's sizes ({', '.join(keys) or 'its layer count and widths'}), "
            "e.g. hf:llama:num_hidden_layers=2,hidden_size=64,num_attention_heads=2,intermediate_size=128,vocab_size=1000")
    check_model_size(spec, ModelSize(0, 0, 0, sample_activation_bytes, _BLOCK_MODULES * _layer_count(cfg)), hint)
    try:
        with torch.random.fork_rng(devices=[]), torch.device("meta"):
            model = from_config(auto, copy.deepcopy(cfg), task, spec)
    except Exception:  # noqa: BLE001 - a config that cannot be built, or a model whose construction needs real
        return  # tensors: the real build reports its own error, or builds it
    params = list(model.parameters())  # a tied weight once
    size = ModelSize(parameters=sum(p.numel() for p in params),
                     parameter_bytes=sum(p.numel() * p.element_size() for p in params),
                     other_bytes=sum(b.numel() * b.element_size() for b in model.buffers()),
                     sample_activation_bytes=sample_activation_bytes, modules=sum(1 for _ in model.modules()))
    check_model_size(spec, size, hint)


def _layer_count(cfg: Any) -> int:
    """The config's blocks: num_hidden_layers (every family's alias of its own name), else the sum of
    its stages' depths; 0 when it names neither."""
    layers = getattr(cfg, "num_hidden_layers", None)
    if isinstance(layers, int) and not isinstance(layers, bool):
        return max(0, layers)
    depths = getattr(cfg, "depths", None)
    if isinstance(depths, (list, tuple)) and all(isinstance(d, int) for d in depths):
        return max(0, sum(depths))
    return 0


def image_input_hint(config: Any, shape: tuple[int, ...], spec: str, error: str = "") -> str | None:
    """What to change when a batch of images (N, C, H, W) that the model failed on (`error`, its
    message) does not match the config's channels or image_size; None when it matches or the config
    has no image size. A ViT's patch embedding refuses any other size ("doesn't match", naming no
    key): its image_size can follow the input. Elsewhere image_size is nominal (a ConvNeXt takes
    any size its downsampling leaves room for) and only the config's own size is offered."""
    size, channels = getattr(config, "image_size", None), getattr(config, "num_channels", None)
    size = size[0] if isinstance(size, (list, tuple)) and size else size
    if len(shape) != 4 or not isinstance(size, int) or isinstance(size, bool):
        return None
    given = tuple(int(d) for d in shape[1:])
    if isinstance(channels, int) and given[0] != channels:
        if given[-1] == channels:  # channels last, as image libraries store them
            return f"--input-shape is channels, height, width: give --input-shape {channels},{given[0]},{given[1]}"
        return f"the model takes {channels}-channel images: give --input-shape {channels},{given[1]},{given[2]}"
    height, width = given[1:]
    if height == width == size:
        return None
    family = ":".join(spec.split(":")[:2]) if spec.startswith("hf:") else spec.split(":")[0]
    resizable = height == width and "match" in error
    resize = f"add image_size={height} to the spec (e.g. {family}:image_size={height},...), or " if resizable else ""
    return f"the spec's image_size is {size} and the input is {height}x{width}: {resize}give --input-shape {given[0]},{size},{size}"
