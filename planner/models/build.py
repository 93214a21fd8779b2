"""build_model: a `--model` string and a seed -> ModelBundle, the same weights in every process."""

from __future__ import annotations

import dataclasses
from typing import Any

from planner.errors import ModelSpecError
from planner.models.bounds import builtin_size, check_model_size
from planner.models.bundle import ModelBundle
from planner.models.spec import builtin_layer_count, parse_spec

__all__ = ["build_model", "layer_count"]

_SHRINK = {
    "gpt": "layers, hidden, vocab, seq or ffn",
    "resnet": "width, stages, blocks, image or classes",
    "mlp": "hidden, layers, input or classes",
    "synthetic": "param_bytes, layers or hidden",
}
"""The keys that size each built-in family, for the hint of a model refused as too large."""
_EXAMPLE = {"gpt": "layers=4,hidden=256", "resnet": "width=32,image=32", "mlp": "hidden=1024", "synthetic": "param_bytes=1MB"}


def build_model(
    spec: str,
    seed: int = 0,
    *,
    input_shape: tuple[int, ...] | None = None,
    input_dtype: str = "float",
    vocab: int | None = None,
    dtype: str | None = None,
) -> ModelBundle:
    """Build the model `spec` with weights drawn from `seed`.

    Weights are drawn under torch.manual_seed(seed) inside a forked RNG state, so two
    processes building the same spec and seed get identical weights and the caller's
    random state is left alone. `input_shape`, `input_dtype` and `vocab` describe the input
    of a plain `module:factory` Sequential (`hf:` models read `input_shape`); the commands refuse
    them for the kinds that do not read them (planner.models.spec.check_input_flags). A built-in
    or `hf:` model too large for this machine is refused before any weight is allocated
    (planner.models.bounds). `dtype` (a profile's: bfloat16, float16; None or float32: as built):
    the weights are drawn in float32, then cast, and make_batch's floating tensors with them, as
    `pplan profile --dtype` measures the model, so `pplan run` trains what the profile priced.
    """
    bundle = _build(spec, seed, input_shape, input_dtype, vocab)
    return bundle if dtype in (None, "float32") else _in_dtype(bundle, dtype)


def _build(spec: str, seed: int, input_shape: tuple[int, ...] | None, input_dtype: str, vocab: int | None) -> ModelBundle:
    """build_model in the dtype each builder draws its weights in (float32)."""
    kind, params = parse_spec(spec)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ModelSpecError(f"seed {seed!r} must be a non-negative integer")
    if kind in _SHRINK:
        _check_builtin_size(spec, kind, params)
    import torch  # here, not at import: planning commands import planner.models without torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if kind == "gpt":
            from planner.models.gpt import build_gpt as build
        elif kind == "resnet":
            from planner.models.resnet import build_resnet as build
        elif kind == "mlp":
            from planner.models.mlp import build_mlp as build
        elif kind == "synthetic":
            from planner.models.synthetic import build_synthetic as build
        elif kind == "hf":
            from planner.models.hf import build_hf

            return build_hf(params, spec, seed, input_shape)
        else:
            from planner.models.factory import build_factory

            return build_factory(params, spec, seed, input_shape, input_dtype, vocab)
        return build(params, spec)


def _in_dtype(bundle: ModelBundle, dtype: str) -> ModelBundle:
    """`bundle` with its layers and the floating tensors of its batches in `dtype` (integer token
    ids and class labels stay as they are)."""
    import torch

    target = getattr(torch, dtype, None)
    if not isinstance(target, torch.dtype) or not target.is_floating_point:
        raise ModelSpecError(f"dtype {dtype!r} is not a floating-point torch dtype", "use float32, bfloat16 or float16")

    def cast(obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            return obj.to(target) if obj.is_floating_point() else obj
        if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a namedtuple takes its fields one by one
            return type(obj)(*(cast(o) for o in obj))
        if isinstance(obj, (tuple, list)):
            return type(obj)(cast(o) for o in obj)
        if isinstance(obj, dict):
            return {k: cast(v) for k, v in obj.items()}
        return obj

    def make_batch(batch_size: int, seed: int) -> tuple[Any, Any]:
        return cast(bundle.make_batch(batch_size, seed))

    return dataclasses.replace(bundle, layers=bundle.layers.to(target), make_batch=make_batch)


def layer_count(spec: str, **model_kwargs: Any) -> int:
    """Number of pipeline layers of `spec`, a model build_model can build here: built-ins counted
    and sized without building (and without torch), factories and `hf:` models by building
    (`model_kwargs`: build_model's input description). Every kind too large for this machine is
    refused the same way, so `pplan run`'s preflight stops it before any rank starts."""
    kind, params = parse_spec(spec)
    if kind in _SHRINK:
        _check_builtin_size(spec, kind, params)
    count = builtin_layer_count(spec)
    return count if count is not None else len(build_model(spec, **model_kwargs).layers)


def _check_builtin_size(spec: str, kind: str, params: dict[str, Any]) -> None:
    """Refuse built-in `spec` above planner.models.bounds' bound, naming the keys that size it."""
    check_model_size(spec, builtin_size(kind, params), f"shrink {_SHRINK[kind]}, e.g. {kind}:{_EXAMPLE[kind]}")
