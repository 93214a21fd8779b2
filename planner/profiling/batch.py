"""A model's batches on the profiler's device: make_batch with its failures as one line, the
input moved (floating tensors in the profiled dtype), the target's bytes per sample."""

from __future__ import annotations

from typing import Any

import torch

from planner.errors import ModelSpecError, PplanError
from planner.profiling.saved import tensor_bytes

__all__ = ["MESSAGE_LIMIT", "to_device", "inputs_to_device", "make_batch", "target_bytes_per_sample"]

MESSAGE_LIMIT = 300  # torch errors can be pages long; the one-line error keeps the start


def to_device(x: object, dev: torch.device, dtype: torch.dtype) -> object:
    if isinstance(x, torch.Tensor):
        return x.to(device=dev, dtype=dtype) if x.is_floating_point() else x.to(dev)
    raise ModelSpecError(f"make_batch returned {type(x).__name__}, not a tensor", "return (input tensor, target tensor)")


def inputs_to_device(x: object, dev: torch.device, dtype: torch.dtype) -> object:
    """A traced model's input: a tensor, or a tuple of them (several forward arguments)."""
    if isinstance(x, tuple):
        return tuple(to_device(t, dev, dtype) for t in x)
    return to_device(x, dev, dtype)


def make_batch(bundle: Any, spec: str, size: int, seed: int) -> tuple[Any, Any]:
    """bundle.make_batch, with an allocation failure as one line."""
    try:
        return bundle.make_batch(size, seed)
    except PplanError:
        raise
    except (RuntimeError, MemoryError) as e:  # torch.OutOfMemoryError is a RuntimeError
        text = " ".join(str(e).split())[:MESSAGE_LIMIT]
        raise PplanError(f"model {spec!r}: making a batch of {size} failed: {type(e).__name__}: {text}",
                         "profile smaller micro-batch sizes") from None


def target_bytes_per_sample(bundle: Any, spec: str, size: int, seed: int) -> float:
    """Bytes of one sample of the target, as make_batch makes it and the run's last stage holds it
    for the whole step (a tuple or dict target travels packed in one tensor: planner.models.targets)."""
    return tensor_bytes(make_batch(bundle, spec, size, seed)[1]) / size
