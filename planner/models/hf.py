"""`hf:MODEL_TYPE[:config_key=value,...]`: a Hugging Face transformers model from its config.

No download: `AutoConfig.for_model(model_type, **config)` and the task's auto class
(`from_config`) give random weights drawn under pplan's seed. The type, the keys, the task,
the vocabulary and the model's size (counted on the meta device) are checked before a weight is
allocated (planner.models.hf_config). The task is the first of masked
LM, causal LM, image classifier that transformers registers for the type. The model is split
along its own structure, the way torch pipelining users split it by module name:

  language models and transformer image classifiers (gpt2, llama, bert, vit, ...: any model
      whose blocks are an nn.ModuleList): embed, block0 .. block{N-1}, head, found by watching
      one forward of the model and run by the model's own code (planner.models.hf_split);
  staged CNNs (resnet, regnet; convnext, convnextv2): embed (stem), one layer per block of
      every stage, head (norm, pooling, classifier), by their common layout (_image_layers).
Every cut is checked when built against the model's own logits and loss on a short probe; a
family whose cut differs, or whose blocks need more than hidden states, is refused in one line.
Losses: the model's own causal-LM loss (`model.loss_function`, labels = the input, shifted
inside); its MLM loss with 15% of the tokens masked; cross-entropy on class ids.

Tied weights (GPT-2's and BERT's input embedding and output projection, ALBERT's shared layer
group) stay tied: the layers hold the same Parameter, and `pplan run` sums its gradients over
the stages that hold it. Dropout defaults to 0 (set `*dropout*`/`*pdrop` keys to turn it on):
pipelined and one-process runs draw different masks, so they could not be compared.
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
from planner.models.hf_config import (check_hf_size, first_plain_token, from_config, image_input_hint, make_config, model_mapping, task_of,
                                      transformers_module)
from planner.models.hf_split import Split, check_split, find_split, observe_once

__all__ = ["build_hf", "PROBE_SEQ"]

_DEFAULT_SEQ = 64
PROBE_SEQ = 16
"""Tokens of the probe batch that finds and checks the cut (planner.models.hf_split)."""


def _first(out: Any) -> torch.Tensor:
    return out[0] if isinstance(out, (tuple, list)) else getattr(out, "last_hidden_state", out)


class _Contiguous(torch.autograd.Function):
    """Identity that makes a layer's output and its gradient contiguous, as they are when they
    cross a cut: ConvNeXt's permuted blocks give strided ones, and kernels on those sum in
    another order, so one process would not train bit for bit as the pipeline does."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.contiguous() if not x.is_contiguous() else x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad.contiguous()


def _contiguous(x: torch.Tensor) -> torch.Tensor:
    return _Contiguous.apply(x) if isinstance(x, torch.Tensor) and x.requires_grad else x.contiguous()


class _Block(nn.Module):
    """One image-model block on its input (no extra arguments)."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.block = block

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return _contiguous(_first(self.block(h)))


class _Part(nn.Module):
    """The prologue or the head of a model cut by planner.models.hf_split: it holds the modules
    whose weights it uses, and runs the model's own code for its part."""

    def __init__(self, run: Callable[[torch.Tensor], torch.Tensor], owned: list[nn.Module]):
        super().__init__()
        self.owned = nn.ModuleList(owned)
        self.__dict__["run"] = run  # a bound method of the Split: not a child

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _contiguous(self.run(x))


class _SplitBlock(nn.Module):
    """Call i of the model's blocks, with the arguments the model passes it (recorded per shape)."""

    def __init__(self, split: Split, i: int):
        super().__init__()
        self.block = split.calls[i]
        self.__dict__["split"], self.i = split, i

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        args, kwargs, by_kw = self.split.block_inputs(self.i, h)
        out = self.block(*args, hidden_states=h, **kwargs) if by_kw else self.block(h, *args, **kwargs)
        return _contiguous(_first(out))


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


def _spatial_mean(h: torch.Tensor) -> torch.Tensor:
    return h.mean([-2, -1])


def _split_layers(split: Split) -> list[tuple[str, nn.Module]]:
    # the head holds the epilogue and the task model's own modules (LM head), in call order
    return ([("embed", _Part(split.embed, split.before))] + [(f"block{i}", _SplitBlock(split, i)) for i in range(len(split.calls))]
            + [("head", _Part(split.head, split.base_tail + split.task_tail))])


def _image_layers(model: nn.Module, spec: str) -> list[tuple[str, nn.Module]] | None:
    """A CNN's blocks sit in stages; one pipeline layer per block, not per stage (the generic
    cut, planner.models.hf_split, would cut at the stage list). None: not a staged CNN."""
    base = model.base_model
    if hasattr(base, "embedder") and hasattr(base, "pooler"):  # resnet, regnet
        layers = [("embed", _Block(base.embedder))]
        for s, stage in enumerate(base.encoder.stages):
            layers += [(f"stage{s}.{j}", _Block(b)) for j, b in enumerate(stage.layers)]
        return layers + [("head", _Head(base.pooler, model.classifier))]
    if hasattr(base, "embeddings") and hasattr(base, "encoder") and hasattr(getattr(base, "encoder"), "stages"):  # convnext, convnextv2
        layers = [("embed", _Block(base.embeddings))]
        for s, stage in enumerate(base.encoder.stages):
            down, blocks = list(stage.downsampling_layer), list(stage.layers)
            seq = [_Block(nn.Sequential(*down, blocks[0]))] + [_Block(b) for b in blocks[1:]]
            layers += [(f"stage{s}.{j}", b) for j, b in enumerate(seq)]
        return layers + [("head", _Head(base.layernorm, model.classifier, pool=_spatial_mean, pool_after=0))]
    return None


def _staged_cnn(model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn: Callable[[Any, Any], Any],
                spec: str) -> nn.Sequential | None:
    """The per-block cut of a staged CNN when the model has that layout and the cut gives its
    own logits (BiT has a norm before its pooler, which this cut does not know); else None."""
    try:
        staged = _image_layers(model, spec)
        if staged is None:
            return None
        layers = _sequential(staged)
        check_split(model, None, layers, "pixel_values", x, y, loss_fn, spec)
        return layers
    except (ModelSpecError, AttributeError, TypeError):
        return None


def _find(model: nn.Module, x: torch.Tensor, key: str, probe: Callable[[torch.Tensor], torch.Tensor], spec: str) -> Split:
    try:
        return find_split(model, x, key, probe, spec)
    except ModelSpecError:
        raise
    except Exception as e:  # noqa: BLE001 - the model's forward failed on the probe: one line
        hint = image_input_hint(getattr(model, "config", None), tuple(x.shape), spec, str(e))
        raise ModelSpecError(f"model {spec!r}: {type(model).__name__} fails on a probe input of shape {tuple(x.shape)}: "
                             f"{type(e).__name__}: {' '.join(str(e).split())[:200]}", hint) from None


def _is_size(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) or isinstance(v, (tuple, list)) and bool(v) and all(map(_is_size, v))


def _check_around_blocks(model: nn.Module, split: Split, key: str, x: torch.Tensor, spec: str) -> None:
    """Refuse, before cutting, what the cut cannot reproduce, seen in one forward of the model:
    blocks that return their output size (integers) besides the hidden states, which the model
    reads between them (PVTv2), and an epilogue whose modules do not each take the previous one's
    output, as the head layer applies them (Swin and FocalNet transpose before their pooler)."""
    n, done, sizes = len(split.calls), [0], []
    inputs: dict[int, Any] = {}
    outputs: dict[int, Any] = {}

    def block_done(m: nn.Module, _args: tuple, out: Any) -> None:
        done[0] += 1
        outputs["last"] = _first(out)
        if isinstance(out, (tuple, list)):
            sizes.extend(v for v in out[1:] if _is_size(v))

    def tail_in(m: nn.Module, args: tuple, kwargs: dict) -> None:
        if done[0] == n and id(m) not in inputs:  # its call after the last block, not one in the prologue
            inputs[id(m)] = next((v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)), None)

    def tail_out(m: nn.Module, _args: tuple, out: Any) -> None:
        if done[0] == n:
            outputs.setdefault(id(m), _first(out))

    handles = [b.register_forward_hook(block_done) for b in set(split.calls)]
    handles += [m.register_forward_pre_hook(tail_in, with_kwargs=True) for m in split.base_tail]
    handles += [m.register_forward_hook(tail_out) for m in split.base_tail]
    observe_once(model, handles, {key: x}, keep_rng=True)  # no random state drawn for the model's weights
    name = type(model).__name__
    if sizes:
        raise ModelSpecError(f"model {spec!r}: cut into layers, {name} would lose the sizes its blocks return besides the hidden "
                             f"states (integers such as {sizes[0]}), which it reads between blocks; pplan's stages send hidden states only",
                             "not supported; see docs/models.md")
    before, prev = "its last block", outputs.get("last")
    for m in split.base_tail:
        given = inputs.get(id(m))
        if isinstance(prev, torch.Tensor) and isinstance(given, torch.Tensor) and (given.shape != prev.shape or not torch.equal(given, prev)):
            change = f"a {tuple(prev.shape)} output becomes a {tuple(given.shape)} input" if given.shape != prev.shape else "the output changed on the way"
            raise ModelSpecError(f"model {spec!r}: cut into layers, {name} would skip the code its forward runs between {before} "
                                 f"and its {type(m).__name__} ({change}): the head layer applies its final modules in turn",
                                 "not supported; see docs/models.md")
        before, prev = f"its {type(m).__name__}", outputs.get(id(m))


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
    def pattern(c: int) -> torch.Tensor:
        # class c's pattern, drawn from its own seed when a sample needs it: a table of every class
        # held for the run is memory on every rank that no profile measures or plan prices, and
        # drawing the whole table per batch costs classes x image (1000 x 3x224x224: 600 MB)
        return torch.randn(*shape, generator=torch.Generator().manual_seed(12345 + c))

    def make(batch_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        labels = torch.randint(0, classes, (batch_size,), generator=g)
        patterns = torch.stack([pattern(int(c)) for c in labels]) if batch_size else torch.zeros(0, *shape)
        return torch.randn(batch_size, *shape, generator=g) + patterns, labels

    return make


def build_hf(params: dict[str, Any], spec: str, seed: int, input_shape: tuple[int, ...] | None) -> ModelBundle:
    """The `hf:` model of `params` (planner.models.spec) as a ModelBundle (module docstring)."""
    tf = transformers_module()
    level = tf.logging.get_verbosity()
    tf.logging.set_verbosity_error()  # a small vocabulary makes it warn about gpt2's default token ids, which pplan unsets
    try:
        return _build(tf, params, spec, input_shape)
    finally:
        tf.logging.set_verbosity(level)


def _build(tf: Any, params: dict[str, Any], spec: str, input_shape: tuple[int, ...] | None) -> ModelBundle:
    model_type, given = params["model_type"], dict(params["config"])
    cfg = make_config(model_type, given, spec)
    task, auto = task_of(tf, cfg, model_type, spec)
    _refuse_label_keys(given, task, auto, cfg, spec)
    # the input and its checks first, then the size (with one sample's activations), then the weights
    if task == "image":
        shape = _image_shape(cfg, spec, input_shape)
        check_hf_size(auto, cfg, task, spec, 4 * int(torch.Size(shape).numel()))
    else:
        seq, token = _lm_seq(cfg, spec, input_shape), first_plain_token(cfg, spec)
        n_layers, hidden = getattr(cfg, "num_hidden_layers", 0), getattr(cfg, "hidden_size", 0)
        per_token = int(cfg.vocab_size) + ((n_layers + 1) * hidden if isinstance(n_layers, int) and isinstance(hidden, int) else 0)
        check_hf_size(auto, cfg, task, spec, 4 * seq * per_token)  # every block's output and the logits, float32
    model = from_config(auto, cfg, task, spec)
    model.train()
    if task == "image":
        bundle = _image_bundle(model, cfg, spec, shape)
    else:
        bundle = _lm_bundle(model, cfg, task == "masked", spec, seq, token)
    bundle.layers.__dict__["source"] = model  # the transformers model itself (not a child: no layer, no parameters twice)
    return bundle


_LABEL_KEYS = ("num_labels", "id2label", "label2id", "problem_type")
"""Config keys only a classification head reads: the LMs pplan builds ignore them."""

_TASK_NAMES = {"masked": "masked LM", "causal": "causal LM", "image": "image classifier"}


def _refuse_label_keys(given: dict[str, Any], task: str, auto: Any, cfg: Any, spec: str) -> None:
    """Refuse a classification key for a language model: `hf:bert:num_labels=3` would build the
    masked LM, silently not the sequence classifier the key asks for."""
    ignored = [k for k in given if k in _LABEL_KEYS]
    if task == "image" or not ignored:
        return
    built = model_mapping(auto)[type(cfg)]
    built = built[0] if isinstance(built, (tuple, list)) else built
    raise ModelSpecError(f"model {spec!r}: {', '.join(ignored)} {'is' if len(ignored) == 1 else 'are'} read by a classification head, but pplan builds "
                         f"the {_TASK_NAMES[task]} ({built.__name__}), which has none",
                         "drop the key; for a sequence classifier, return from a factory a module whose forward calls "
                         "the model's embeddings, each encoder layer and a head (docs/models.md, 'A wrapper over a model's submodules')")


def _image_shape(cfg: Any, spec: str, input_shape: tuple[int, ...] | None) -> tuple[int, ...]:
    """One image: --input-shape C,H,W, default the config's channels and image size (else 3,32,32)."""
    channels = int(getattr(cfg, "num_channels", 3))
    size = getattr(cfg, "image_size", 32)
    size = int(size[0] if isinstance(size, (list, tuple)) else size)
    shape = tuple(input_shape) if input_shape else (channels, size, size)
    if len(shape) != 3:
        raise ModelSpecError(f"model {spec!r}: --input-shape {','.join(map(str, shape))} is not an image (C,H,W)", "e.g. --input-shape 3,32,32")
    return shape


def _image_bundle(model: nn.Module, cfg: Any, spec: str, shape: tuple[int, ...]) -> ModelBundle:
    """An image classifier cut per block when it is a staged CNN, else by its own structure;
    its data: noise around one fixed pattern per class, its loss cross-entropy."""
    classes = int(cfg.num_labels)
    make = _image_batch(shape, classes)

    def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.float(), labels)

    x, y = make(2, 0)
    layers = _staged_cnn(model, x, y, loss_fn, spec)
    if layers is None:  # not laid out like one: the generic cut
        split = _find(model, x, "pixel_values", lambda h: torch.zeros(h.shape[0], *shape), spec)
        _check_around_blocks(model, split, "pixel_values", x, spec)
        layers = _sequential(_split_layers(split))
        check_split(model, split, layers, "pixel_values", x, y, loss_fn, spec)

    meta = {"input_shape": ",".join(map(str, shape)), "input_dtype": "float", "vocab": ""}
    return ModelBundle(spec, layers, make, loss_fn, 4 * int(torch.Size(shape).numel()), input_meta=meta)


def _lm_seq(cfg: Any, spec: str, input_shape: tuple[int, ...] | None) -> int:
    """Tokens per sample: --input-shape's one number (default _DEFAULT_SEQ), within the config's positions."""
    seq = int(input_shape[0]) if input_shape else _DEFAULT_SEQ
    if input_shape is not None and len(input_shape) != 1:
        raise ModelSpecError(f"model {spec!r}: --input-shape for a language model is one number, tokens per sample", "e.g. --input-shape 64")
    limit = getattr(cfg, "n_positions", None) or getattr(cfg, "max_position_embeddings", None)
    if limit and seq > limit:
        raise ModelSpecError(f"model {spec!r}: {seq} tokens per sample exceed the config's {limit} positions", "give a shorter --input-shape or raise the positions in the spec")
    return seq


def _lm_bundle(model: nn.Module, cfg: Any, masked: bool, spec: str, seq: int, token: int) -> ModelBundle:
    """A causal or masked LM cut by its own structure, on `seq` tokens per sample; its data:
    arithmetic token sequences (15% masked for an MLM), its loss the model's own. `token`: the
    probe's filler (planner.models.hf_config.first_plain_token)."""
    vocab = int(cfg.vocab_size)
    make = _lm_batch(vocab, seq, masked)
    own_loss = model.loss_function  # transformers' ForCausalLMLoss / ForMaskedLMLoss

    def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        # ForMaskedLMLoss flattens both with .view: tensors sliced along the sequence (strided) would
        # fail in a user's loop; .contiguous() copies nothing for pplan's own (contiguous) ones
        return own_loss(logits=logits.contiguous(), labels=labels.contiguous(), vocab_size=vocab)

    # a short probe: watch the forward, then check the cut against the model's own output. Drawn
    # at the probe's length, not sliced from a longer batch: a slice is strided, and the masked
    # LMs' own forward (BERT's, RoBERTa's, ...) flattens its labels with .view, which fails on it
    x, y = _lm_batch(vocab, min(seq, PROBE_SEQ), masked)(2, 0)
    split = _find(model, x, "input_ids", lambda h: torch.full(h.shape[:2], token, dtype=torch.long), spec)
    _check_around_blocks(model, split, "input_ids", x, spec)
    layers = _sequential(_split_layers(split))
    check_split(model, split, layers, "input_ids", x, y, loss_fn, spec)

    meta = {"input_shape": str(seq), "input_dtype": "long", "vocab": str(vocab)}
    return ModelBundle(spec, layers, make, loss_fn, 8 * seq, input_meta=meta)
