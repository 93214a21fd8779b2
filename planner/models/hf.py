"""`hf:MODEL_TYPE[:config_key=value,...]`: a Hugging Face transformers model from its config.

No download: `AutoConfig.for_model(model_type, **config)` and the task's auto class
(`from_config`) give random weights drawn under pplan's seed. The model is split along its
own structure, the way torch pipelining users split it by module name:

  causal LMs (gpt2; llama, mistral, qwen2 and others laid out like llama)
      embed, block0 .. block{N-1}, head (final norm + LM head); loss: the model's own
      causal-LM loss (`model.loss_function`, labels = the input, shifted inside);
  masked LMs (bert and others laid out like it)
      embed, block0 .., head (the MLM head); 15% of the tokens masked, the model's MLM loss;
  image classifiers (vit; resnet; convnext)
      embed (patch embedding / stem), one layer per encoder block, head (norm, pooling,
      classifier); cross-entropy on class ids.

Tied weights (GPT-2's and BERT's input embedding and output projection) stay tied: the
embedding layer and the head hold the same Parameter, and `pplan run` sums its gradients
over the stages that hold it. Dropout defaults to 0 (set `*dropout*`/`*pdrop` keys to turn
it on): pipelined and one-process runs draw different masks, so they could not be compared.
Input: `--input-shape SEQ` (tokens per sample, default 64) for LMs, `--input-shape 3,H,W`
for images (default the config's image size, else 3,32,32).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from planner.errors import ModelSpecError
from planner.models.bundle import ModelBundle

__all__ = ["build_hf"]

_DEFAULT_SEQ = 64


def _transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise ModelSpecError("hf: models need the transformers package", "pip install -e '.[hf]' (or pip install transformers)") from None
    return transformers


def _config(model_type: str, given: dict[str, Any], spec: str) -> Any:
    tf = _transformers()
    try:
        cfg = tf.AutoConfig.for_model(model_type, **given)
    except Exception as e:  # noqa: BLE001 - an unknown type or a bad key: one line
        raise ModelSpecError(f"model {spec!r}: transformers cannot make a {model_type!r} config: {type(e).__name__}: {e}",
                             "model types are transformers' names: gpt2, llama, mistral, qwen2, bert, vit, resnet, convnext") from None
    for key, value in list(vars(cfg).items()):
        if key in given or isinstance(value, bool) or not isinstance(value, float):
            continue
        if "dropout" in key or key.endswith("pdrop") or key == "drop_path_rate":
            setattr(cfg, key, 0.0)
    vocab = getattr(cfg, "vocab_size", None)
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = getattr(cfg, key, None)
        if isinstance(value, int) and vocab and value >= vocab and key not in given:
            setattr(cfg, key, None)
    if hasattr(cfg, "use_cache"):
        cfg.use_cache = False
    return cfg


class _Embed(nn.Module):
    """Token (and learned position) embedding of a causal LM."""

    def __init__(self, tokens: nn.Module, positions: nn.Module | None = None, drop: nn.Module | None = None):
        super().__init__()
        self.tokens, self.positions, self.drop = tokens, positions, drop

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.tokens(ids)
        if self.positions is not None:
            h = h + self.positions(torch.arange(ids.shape[1], device=ids.device))[None]
        return self.drop(h) if self.drop is not None else h


def _first(out: Any) -> torch.Tensor:
    return out[0] if isinstance(out, (tuple, list)) else getattr(out, "last_hidden_state", out)


class _Block(nn.Module):
    """One transformer block on hidden states (no mask: causal by the attention's own flag)."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.block = block

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return _first(self.block(h))


class _RopeBlock(nn.Module):
    """A llama-style decoder layer; the rotary embedding is recomputed from positions 0..T-1."""

    def __init__(self, block: nn.Module, rotary: nn.Module):
        super().__init__()
        self.block = block
        self.__dict__["rotary"] = rotary  # no parameters; not a child, so not counted per layer

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(h.shape[1], device=h.device)[None]
        return _first(self.block(h, position_ids=pos, position_embeddings=self.rotary(h, pos)))


class _Head(nn.Module):
    """Final steps: the modules in order, with an optional function between (pooling)."""

    def __init__(self, *mods: nn.Module, pool: Callable[[torch.Tensor], torch.Tensor] | None = None, pool_after: int = 0):
        super().__init__()
        self.mods = nn.ModuleList(mods)
        self.pool, self.pool_after = pool, pool_after

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        for i, m in enumerate(self.mods):
            if self.pool is not None and i == self.pool_after:
                h = self.pool(h)
            h = _first(m(h))
        return h


def _cls_token(h: torch.Tensor) -> torch.Tensor:
    return h[:, 0]


def _spatial_mean(h: torch.Tensor) -> torch.Tensor:
    return h.mean([-2, -1])


def _causal_layers(model: nn.Module, spec: str) -> list[tuple[str, nn.Module]]:
    base = model.base_model
    if all(hasattr(base, k) for k in ("wte", "wpe", "h", "ln_f")):  # gpt2
        return ([("embed", _Embed(base.wte, base.wpe, base.drop))] + [(f"block{i}", _Block(b)) for i, b in enumerate(base.h)]
                + [("head", _Head(base.ln_f, model.lm_head))])
    if all(hasattr(base, k) for k in ("embed_tokens", "layers", "norm", "rotary_emb")):  # llama, mistral, qwen2, ...
        return ([("embed", _Embed(base.embed_tokens))] + [(f"block{i}", _RopeBlock(b, base.rotary_emb)) for i, b in enumerate(base.layers)]
                + [("head", _Head(base.norm, model.lm_head))])
    raise ModelSpecError(f"model {spec!r}: pplan does not know how to split {type(model).__name__} into layers",
                         "causal LMs laid out like gpt2 (wte, wpe, h, ln_f) or llama (embed_tokens, layers, norm, rotary_emb) are supported")


def _masked_layers(model: nn.Module, spec: str) -> list[tuple[str, nn.Module]]:
    base = model.base_model
    encoder = getattr(base, "encoder", None)
    blocks = getattr(encoder, "layer", None) or getattr(encoder, "layers", None)
    head = getattr(model, "cls", None) or getattr(model, "lm_head", None)
    if not hasattr(base, "embeddings") or blocks is None or head is None:
        raise ModelSpecError(f"model {spec!r}: pplan does not know how to split {type(model).__name__} into layers",
                             "masked LMs laid out like bert (embeddings, encoder.layer, cls) are supported")
    return [("embed", _Block(base.embeddings))] + [(f"block{i}", _Block(b)) for i, b in enumerate(blocks)] + [("head", _Block(head))]


def _image_layers(model: nn.Module, spec: str) -> list[tuple[str, nn.Module]]:
    base = model.base_model
    if hasattr(base, "embeddings") and hasattr(base, "layernorm") and isinstance(getattr(base, "layers", None), nn.ModuleList):  # vit
        return ([("embed", _Block(base.embeddings))] + [(f"block{i}", _Block(b)) for i, b in enumerate(base.layers)]
                + [("head", _Head(base.layernorm, model.classifier, pool=_cls_token, pool_after=1))])
    if hasattr(base, "embedder") and hasattr(base, "pooler"):  # resnet
        layers = [("embed", _Block(base.embedder))]
        for s, stage in enumerate(base.encoder.stages):
            layers += [(f"stage{s}.{j}", _Block(b)) for j, b in enumerate(stage.layers)]
        return layers + [("head", _Head(base.pooler, model.classifier))]
    if hasattr(base, "embeddings") and hasattr(base, "encoder") and hasattr(getattr(base, "encoder"), "stages"):  # convnext
        layers = [("embed", _Block(base.embeddings))]
        for s, stage in enumerate(base.encoder.stages):
            down, blocks = list(stage.downsampling_layer), list(stage.layers)
            seq = [_Block(nn.Sequential(*down, blocks[0]))] + [_Block(b) for b in blocks[1:]]
            layers += [(f"stage{s}.{j}", b) for j, b in enumerate(seq)]
        return layers + [("head", _Head(base.layernorm, model.classifier, pool=_spatial_mean, pool_after=0))]
    raise ModelSpecError(f"model {spec!r}: pplan does not know how to split {type(model).__name__} into layers",
                         "image classifiers laid out like vit, resnet or convnext are supported")


def _sequential(pairs: list[tuple[str, nn.Module]]) -> nn.Sequential:
    return nn.Sequential(OrderedDict((name.replace(".", "_"), m) for name, m in pairs))


def _lm_batch(vocab: int, seq: int, masked: bool) -> Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]:
    def make(batch_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        # arithmetic sequences modulo the vocabulary: a causal LM can learn them
        start = torch.randint(0, vocab, (batch_size, 1), generator=g)
        stride = torch.randint(1, max(2, min(vocab, 8)), (batch_size, 1), generator=g)
        ids = (start + stride * torch.arange(seq)) % vocab
        if not masked:
            return ids, ids.clone()
        mask = torch.rand(batch_size, seq, generator=g) < 0.15
        mask[:, 0] = True  # every sample has a masked token: the loss is never an empty mean
        labels = torch.where(mask, ids, torch.full_like(ids, -100))
        return torch.where(mask, torch.zeros_like(ids), ids), labels  # token 0 stands for [MASK]

    return make


def _image_batch(shape: tuple[int, ...], classes: int) -> Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]:
    patterns = torch.randn(classes, *shape, generator=torch.Generator().manual_seed(12345))

    def make(batch_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        labels = torch.randint(0, classes, (batch_size,), generator=g)
        return torch.randn(batch_size, *shape, generator=g) + patterns[labels], labels

    return make


def build_hf(params: dict[str, Any], spec: str, seed: int, input_shape: tuple[int, ...] | None) -> ModelBundle:
    """The `hf:` model of `params` (planner.models.spec) as a ModelBundle (module docstring)."""
    tf = _transformers()
    level = tf.logging.get_verbosity()
    tf.logging.set_verbosity_error()  # a small vocabulary makes it warn about gpt2's default token ids, which pplan unsets
    try:
        return _build(tf, params, spec, input_shape)
    finally:
        tf.logging.set_verbosity(level)


def _build(tf: Any, params: dict[str, Any], spec: str, input_shape: tuple[int, ...] | None) -> ModelBundle:
    model_type, given = params["model_type"], dict(params["config"])
    cfg = _config(model_type, given, spec)
    # masked first: BERT is also registered as a causal LM (its decoder variant)
    tasks = (("masked", tf.AutoModelForMaskedLM), ("causal", tf.AutoModelForCausalLM),
             ("image", tf.AutoModelForImageClassification))
    task = next((name for name, auto in tasks if type(cfg) in auto._model_mapping), None)
    if task is None:
        raise ModelSpecError(f"model {spec!r}: {model_type!r} is not a causal LM, masked LM or image classifier in transformers",
                             "supported: gpt2, llama, mistral, qwen2 (causal), bert (masked), vit, resnet, convnext (images)")
    auto = dict(tasks)[task]
    kwargs = {"attn_implementation": "sdpa"} if task != "image" else {}
    try:
        model = auto.from_config(cfg, **kwargs)
    except (ValueError, ImportError):
        model = auto.from_config(cfg)
    except Exception as e:  # noqa: BLE001 - inconsistent config values: one line
        raise ModelSpecError(f"model {spec!r}: building it failed: {type(e).__name__}: {e}") from None
    model.train()
    if task == "image":
        channels = int(getattr(cfg, "num_channels", 3))
        size = getattr(cfg, "image_size", 32)
        size = int(size[0] if isinstance(size, (list, tuple)) else size)
        shape = tuple(input_shape) if input_shape else (channels, size, size)
        if len(shape) != 3:
            raise ModelSpecError(f"model {spec!r}: --input-shape {','.join(map(str, shape))} is not an image (C,H,W)", "e.g. --input-shape 3,32,32")
        classes = int(cfg.num_labels)
        layers = _sequential(_image_layers(model, spec))
        make = _image_batch(shape, classes)

        def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(logits.float(), labels)

        meta = {"input_shape": ",".join(map(str, shape)), "input_dtype": "float", "vocab": ""}
        per_sample = 4 * int(torch.Size(shape).numel())
    else:
        seq = int(input_shape[0]) if input_shape else _DEFAULT_SEQ
        if input_shape is not None and len(input_shape) != 1:
            raise ModelSpecError(f"model {spec!r}: --input-shape for a language model is one number, tokens per sample", "e.g. --input-shape 64")
        limit = getattr(cfg, "n_positions", None) or getattr(cfg, "max_position_embeddings", None)
        if limit and seq > limit:
            raise ModelSpecError(f"model {spec!r}: {seq} tokens per sample exceed the config's {limit} positions", "give a shorter --input-shape or raise the positions in the spec")
        vocab = int(cfg.vocab_size)
        layers = _sequential(_causal_layers(model, spec) if task == "causal" else _masked_layers(model, spec))
        make = _lm_batch(vocab, seq, task == "masked")
        own_loss = model.loss_function  # transformers' ForCausalLMLoss / ForMaskedLMLoss

        def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            return own_loss(logits=logits, labels=labels, vocab_size=vocab)

        meta = {"input_shape": str(seq), "input_dtype": "long", "vocab": str(vocab)}
        per_sample = 8 * seq
    layers.__dict__["source"] = model  # the transformers model itself (not a child: no layer, no parameters twice)
    return ModelBundle(spec, layers, make, loss_fn, per_sample, input_meta=meta)
