"""`package.module:factory[:key=value,...]`: a user model from any importable callable.

The factory is called as `factory(**kwargs)` (plus `seed=` if it accepts a `seed` argument),
under `torch.manual_seed(seed)`, and returns one of:
  1. a `ModelBundle`: used as it is;
  2. an `nn.Sequential` with attributes `make_batch(batch_size, seed) -> (input, target)` and
     `loss_fn(output, target)`: the model brings its own data and loss;
  3. a plain `nn.Sequential`: the input is random data of `--input-shape` (one sample, no
     batch dim) and `--input-dtype` (`float`: standard normal; `long`: tokens below
     `--vocab`), the target random normal of the output's shape and the loss mean squared
     error (an output that is a tuple or dict of tensors: one target each, the errors
     summed). The output shape is found by one forward pass on a batch of 1.
  4. any other `nn.Module` whose `forward` torch.fx can trace (skip connections, branches:
     a U-Net, a ResNet written with `x + block(x)` at the top level), with `make_batch` and
     `loss_fn` as in 2, or with `--input-shape` as in 3. It is traced on a batch of 1
     (planner.graph.trace_layers: layers = the top-level modules it calls, in program order)
     and `layers` is a `planner.graph.GraphSequential`: an nn.Sequential whose children run
     the traced layers one after the other, passing the dict of tensors that cross each cut,
     with the LayerGraph (skip edges, per-layer modules) as `layers.graph`. Control flow on
     tensor values inside a layer module (which fx cannot trace) makes pplan trace again with
     every layer module run whole (`opaque=True`); in the model's own forward it fails here
     with one line (ModelSpecError). docs/graph.md has the details.
A target that is a tuple or dict of tensors travels packed in one tensor, and an output that is a
dict reaches the loss as a tuple, rebuilt before the user's loss_fn (planner.models.targets).
The current directory is put on sys.path first, so `mymodels:build` finds ./mymodels.py.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import inspect
import os
import sys
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._pytree import tree_leaves

from planner.errors import ModelSpecError
from planner.jsonio import nearest
from planner.models.bundle import ModelBundle
from planner.models.spec import BUILTIN_KINDS, hf_spelling
from planner.models.targets import flatten_structured_output, mse_over_leaves, noise_like, pack_structured_target

__all__ = ["build_factory", "random_input_maker", "out_of_place", "eval_forward", "few_layers_warning"]

_DTYPES = {"float": torch.float32, "long": torch.long}  # the keys are planner.models.spec.INPUT_DTYPES


def _load(module: str, name: str, spec: str) -> Callable[..., Any]:
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        raise ModelSpecError(f"model {spec!r}: cannot import module {module!r} ({e})", _import_hint(module, spec)) from None
    except Exception as e:  # a user module that fails on import: report it on one line
        raise ModelSpecError(f"model {spec!r}: importing {module!r} failed: {type(e).__name__}: {e}") from None
    obj: Any = mod
    for part in name.split("."):
        if not hasattr(obj, part):
            raise ModelSpecError(f"model {spec!r}: {module!r} has no attribute {name!r}", _callables_hint(obj, part))
        obj = getattr(obj, part)
    if not callable(obj):
        raise ModelSpecError(f"model {spec!r}: {module}:{name} is not callable",
                             "point at a function returning an nn.Module (an nn.Sequential or any module torch.fx can "
                             "trace) or a ModelBundle")
    return obj


def _import_hint(module: str, spec: str) -> str:
    """What to do when a factory's module is not found: `hf:` for a Hugging Face type written
    without it (`llama:...` reads as module llama), else where Python looks and the other kinds."""
    hf = hf_spelling(module, spec)
    if hf is not None:
        return f"did you mean {hf!r}? Hugging Face models take the hf: prefix"
    return (f"run from the directory that holds it, or set PYTHONPATH; built-in kinds are {', '.join(BUILTIN_KINDS)}, "
            "and hf:MODEL_TYPE builds a Hugging Face model")


def _callables_hint(owner: Any, missing: str) -> str:
    """The public callables of `owner` (a module or a class) nearest to `missing`, else the first few."""
    names = sorted(n for n in dir(owner) if not n.startswith("_") and callable(getattr(owner, n, None)))
    own = [n for n in names if getattr(getattr(owner, n), "__module__", None) == getattr(owner, "__name__", "")]
    names = own or names  # a module's own functions and classes, not what it imported
    if not names:
        return "it defines no public function or class to call"
    close = difflib.get_close_matches(missing, names, n=3, cutoff=0.5)
    if close:
        return f"did you mean {', '.join(map(repr, close))}?"
    shown = names[:8]
    return f"its callables: {', '.join(shown)}{', ...' if len(names) > len(shown) else ''}"


def random_input_maker(shape: tuple[int, ...], dtype: str, vocab: int | None) -> Callable[[int, int], torch.Tensor]:
    """(batch_size, seed) -> random input of (batch_size, *shape), deterministic per seed."""

    def make(batch_size: int, seed: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed)
        if dtype == "long":
            return torch.randint(0, vocab or 2, (batch_size, *shape), generator=g)
        return torch.randn(batch_size, *shape, generator=g)

    return make


def out_of_place(model: nn.Module) -> nn.Module:
    """Turn off `inplace=True` (nn.ReLU(inplace=True), Dropout, ...) on every submodule.

    A pipeline stage receives its input as a leaf tensor that requires grad, and autograd
    refuses an in-place op on it; the out-of-place op computes the same values. Traced
    models also get their in-place calls rewritten (planner.graph.trace).
    """
    for m in model.modules():
        if isinstance(getattr(m, "inplace", None), bool) and m.inplace:
            m.inplace = False
    return model


def eval_forward(model: nn.Module, x: Any) -> Any:
    """model(x) without gradients in eval mode, modes restored: a probe that moves no
    BatchNorm statistics and works on a batch of one."""
    modes = [(m, m.training) for m in model.modules()]
    try:
        model.eval()
        with torch.no_grad():
            return model(x)
    finally:
        for m, training in modes:
            m.training = training


def _call(factory: Callable[..., Any], kwargs: dict[str, Any], seed: int, spec: str) -> Any:
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        params = {}
    _check_keywords(params, kwargs, spec)
    if "seed" in params:
        kwargs = {**kwargs, "seed": seed}
    try:
        return factory(**kwargs)
    except TypeError as e:
        raise ModelSpecError(f"model {spec!r}: calling the factory failed: {e}", "pass keyword arguments as module:factory:key=value,...") from None
    except Exception as e:
        raise ModelSpecError(f"model {spec!r}: the factory raised {type(e).__name__}: {e}") from None


def _check_keywords(params: Any, kwargs: dict[str, Any], spec: str) -> None:
    """Refuse a key the factory has no parameter for, with the nearest one, as an unknown key of a
    built-in is (else Python's "got an unexpected keyword argument 'dd'" names no alternative). A
    factory taking **kwargs accepts any key; `seed` is pplan's to pass."""
    if not params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    named = [p for p in params.values() if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
             and p.name != "seed"]
    for key in kwargs:
        if key not in {p.name for p in named}:
            guess = nearest(key, [p.name for p in named])
            shown = ", ".join(p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}" for p in named)
            raise ModelSpecError(f"model {spec!r}: unknown key {key!r}: the factory has no parameter of that name",
                                 (f"did you mean {guess!r}? " if guess else "") + f"its parameters: {shown or 'none'}")


def build_factory(p: dict[str, Any], spec: str, seed: int, input_shape: tuple[int, ...] | None, input_dtype: str, vocab: int | None) -> ModelBundle:
    """Import and call the factory (see module docstring); the result as a ModelBundle."""
    bundle = _build(p, spec, seed, input_shape, input_dtype, vocab)
    try:
        out = eval_forward(bundle.layers, bundle.make_batch(1, 0)[0])
    except Exception as e:  # noqa: BLE001 - the user's model fails on its own example: one line
        raise ModelSpecError(f"model {spec!r} fails on a batch of one of its own input: {type(e).__name__}: {' '.join(str(e).split())[:300]}",
                             "check make_batch against the model's forward") from None
    # a dict output: the last layer returns its tensors as a tuple, the loss rebuilds the dict
    loss_fn = flatten_structured_output(bundle.layers, bundle.loss_fn, out)
    return bundle if loss_fn is bundle.loss_fn else dataclasses.replace(bundle, loss_fn=loss_fn)


def _build(p: dict[str, Any], spec: str, seed: int, input_shape: tuple[int, ...] | None, input_dtype: str, vocab: int | None) -> ModelBundle:
    made = _call(_load(p["module"], p["callable"], spec), dict(p["kwargs"]), seed, spec)
    if isinstance(made, ModelBundle):
        out_of_place(made.layers)
        make_batch, loss_fn = pack_structured_target(made.make_batch, made.loss_fn, spec)
        return dataclasses.replace(made, make_batch=make_batch, loss_fn=loss_fn)
    if isinstance(made, nn.Module):
        _refuse_encoder_decoder(made, spec)
        out_of_place(made)
    traced = isinstance(made, nn.Module) and not isinstance(made, nn.Sequential)
    if not traced and (not isinstance(made, nn.Sequential) or len(made) == 0):
        raise ModelSpecError(f"model {spec!r}: the factory returned {type(made).__name__}, not a non-empty nn.Sequential or another nn.Module", "return nn.Sequential(OrderedDict(name=layer, ...)), an nn.Module whose forward torch.fx can trace, or a ModelBundle")
    make_batch, loss_fn = getattr(made, "make_batch", None), getattr(made, "loss_fn", None)
    if callable(make_batch) and callable(loss_fn):
        make_batch, loss_fn = pack_structured_target(make_batch, loss_fn, spec)  # a tuple or dict target: one tensor
        x, _ = make_batch(1, 0)
        if traced:
            return _traced_bundle(made, spec, x, make_batch, loss_fn)
        if not isinstance(x, torch.Tensor):  # a pipeline stage calls the Sequential with its inputs as arguments
            raise ModelSpecError(f"model {spec!r}: make_batch gives {_described(x)} as the input of an nn.Sequential, "
                                 "which takes one tensor",
                                 "for several inputs return an nn.Module whose forward takes them as positional tensors, e.g. "
                                 "forward(self, input_ids, attention_mask), with make_batch returning ((input_ids, "
                                 "attention_mask), target) (docs/models.md, 'The input contract')")
        return ModelBundle(spec, made, make_batch, loss_fn, int(x.numel() * x.element_size()))
    if input_shape is None:
        raise ModelSpecError(f"model {spec!r} does not say what its input is", "give --input-shape (one sample, e.g. 3,32,32) and --input-dtype, or set make_batch and loss_fn on the Sequential")
    if input_dtype not in _DTYPES:
        raise ModelSpecError(f"--input-dtype {input_dtype!r} is not one of {', '.join(_DTYPES)}")
    if input_dtype == "long" and not vocab:
        raise ModelSpecError("--input-dtype long needs --vocab (token ids are drawn below it)")
    make_input = random_input_maker(tuple(input_shape), input_dtype, vocab)
    try:
        out = eval_forward(made, make_input(1, 0))
    except Exception as e:
        raise ModelSpecError(f"model {spec!r} fails on an input of shape (1, {', '.join(map(str, input_shape))}): {type(e).__name__}: {e}", "check --input-shape and --input-dtype") from None
    if not isinstance(out, torch.Tensor):
        return _structured_output_bundle(made, spec, out, make_input, traced, input_shape, input_dtype)
    out_shape = tuple(out.shape[1:])
    # An image classifier (input C,H,W, output one score per class) trains on class ids with
    # cross-entropy; anything else regresses standard normal noise of the output's shape.
    classify = input_dtype == "float" and len(input_shape) == 3 and len(out_shape) == 1 and out_shape[0] >= 2

    def make(batch_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(seed + 1_000_003)  # a target stream apart from the input's
        if classify:
            return make_input(batch_size, seed), torch.randint(0, out_shape[0], (batch_size,), generator=g)
        return make_input(batch_size, seed), torch.randn(batch_size, *out_shape, generator=g)

    def mse(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if classify:
            return F.cross_entropy(output.float(), target)
        return F.mse_loss(output.float(), target.float())

    if traced:
        return _traced_bundle(made, spec, make_input(1, 0), make, mse)
    per_sample = int(torch.Size(input_shape).numel() * (8 if input_dtype == "long" else 4))
    return ModelBundle(spec, made, make, mse, per_sample)


def _structured_output_bundle(made: nn.Module, spec: str, out: Any, make_input: Callable[[int, int], torch.Tensor], traced: bool,
                              input_shape: tuple[int, ...], input_dtype: str) -> ModelBundle:
    """A model returning a tuple or dict of tensors (two heads): each regresses standard normal
    noise of its shape and the loss is the sum of their mean squared errors."""
    leaves = tree_leaves(out)
    bad = sorted({type(t).__name__ if not isinstance(t, torch.Tensor) else "a 0-d tensor" for t in leaves
                  if not isinstance(t, torch.Tensor) or t.dim() == 0})
    if not leaves or bad:
        raise ModelSpecError(f"model {spec!r}: the {'model' if traced else 'last layer'} returns a {type(out).__name__} holding "
                             f"{', '.join(bad) or 'nothing'}, where pplan needs tensors with a batch dimension",
                             "return a tensor, or a tuple or dict of tensors; or set make_batch and loss_fn on the model")

    def make(batch_size: int, seed: int) -> tuple[torch.Tensor, Any]:
        g = torch.Generator().manual_seed(seed + 1_000_003)  # a target stream apart from the input's
        return make_input(batch_size, seed), noise_like(out, batch_size, g)

    make_batch, loss_fn = pack_structured_target(make, mse_over_leaves, spec)
    if traced:
        return _traced_bundle(made, spec, make_input(1, 0), make_batch, loss_fn)
    per_sample = int(torch.Size(input_shape).numel() * (8 if input_dtype == "long" else 4))
    return ModelBundle(spec, made, make_batch, loss_fn, per_sample)


def _traced_bundle(model: nn.Module, spec: str, example: Any, make_batch: Callable[[int, int], tuple[Any, Any]],
                   loss_fn: Callable[[Any, Any], Any]) -> ModelBundle:
    """Case 4 of the module docstring: trace, then wrap the layers as a GraphSequential."""
    from planner.graph.sequential import as_sequential
    from planner.graph.trace import trace_layers

    try:
        lg = trace_layers(model, example, balance=True)  # a heavy container is split into its blocks
    except ModelSpecError as e:
        if not e.message.startswith("torch.fx cannot trace"):
            raise ModelSpecError(f"model {spec!r}: {e.message}", e.hint) from None
        try:  # control flow on tensor values inside the layer modules: run each of them whole, untraced
            lg = trace_layers(model, example, balance=True, opaque=True)
        except ModelSpecError:
            raise ModelSpecError(f"model {spec!r}: {e.message}", _untraceable_hint(model)) from None
    return ModelBundle(spec, as_sequential(lg, source=model), make_batch, loss_fn, lg.input_bytes_per_sample)


def _hf_model_type(model: nn.Module) -> str | None:
    """The model_type of a Hugging Face transformers model (its class comes from transformers and
    it carries a config), else None."""
    config = getattr(model, "config", None)
    if type(model).__module__.split(".")[0] != "transformers" or config is None:
        return None
    return str(getattr(config, "model_type", "") or "") or None


def _untraceable_hint(model: nn.Module) -> str:
    """What to do when fx cannot trace the model's own forward, even with every layer run whole."""
    name = type(model).__name__
    model_type = _hf_model_type(model)
    if model_type is not None:  # its forward is transformers' own, with paths fx cannot follow, not the user's
        return (f"{name} is a Hugging Face model, whose forward fx cannot trace: use hf:{model_type} (pplan builds the first of "
                "masked LM, causal LM, image classifier transformers has for it), or return a module whose forward calls its submodules (embeddings, "
                "each encoder layer, the head: docs/models.md, 'A wrapper over a model's submodules')")
    return (f"the if or loop on a tensor's value is in {name}.forward itself: move it into a submodule "
            "(pplan runs a submodule whole) or have the factory return an nn.Sequential of the layers; see docs/graph.md")


def _refuse_encoder_decoder(model: nn.Module, spec: str) -> None:
    """An encoder-decoder (T5, BART) as `hf:` refuses it, before a probe fails on its missing decoder input."""
    if getattr(getattr(model, "config", None), "is_encoder_decoder", False) is True:
        raise ModelSpecError(f"model {spec!r}: {type(model).__name__} is an encoder-decoder model (two stacks of blocks, the "
                             "decoder's reading the encoder's output), not the one stack of layers pplan cuts",
                             "wrap its submodules in a `module:factory` (docs/models.md, 'Encoder-decoder models', "
                             "shows BART's), or use a decoder-only or encoder-only family")


def few_layers_warning(n_layers: int, names: tuple[str, ...] | list[str]) -> str | None:
    """The warning `pplan profile` prints for a model of fewer than 2 layers: there is no cut to
    place, so its plans have one stage; None for 2 layers or more."""
    if n_layers >= 2:
        return None
    shown = f" ({', '.join(map(repr, names))})" if names else ""
    return (f"the model gave {n_layers} layer{'' if n_layers == 1 else 's'}{shown}: a pipeline cuts between layers, so it "
            "plans on 1 device only; return a module whose forward calls the model's submodules (embeddings, each block, "
            "the head) so each is a layer (docs/models.md, 'A wrapper over a model's submodules')")


def _described(x: Any) -> str:
    """An input that is not one tensor, in a few words: 'a dict (keys 'input_ids', 'mask')', 'a tuple of 2'."""
    if isinstance(x, dict):
        return f"a dict (keys {', '.join(map(repr, list(x)[:4]))}{', ...' if len(x) > 4 else ''})"
    return f"a {type(x).__name__} of {len(x)}" if isinstance(x, (tuple, list)) else f"a {type(x).__name__}"
