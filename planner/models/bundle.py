"""ModelBundle: a model cut into pipeline layers, with its data and loss. Imports no torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # only for annotations: planning code imports this module without torch
    import torch

__all__ = ["ModelBundle"]


@dataclass(frozen=True)
class ModelBundle:
    """Everything needed to profile or run a model as a pipeline of layers."""

    spec: str
    """The `--model` string it was built from."""
    layers: "torch.nn.Sequential"
    """One child per pipeline layer, named (`embed`, `block0`, ..., `norm_head`)."""
    make_batch: Callable[[int, int], tuple[Any, Any]]
    """(batch_size, seed) -> (input, target) on the CPU, the same tensors for the same seed."""
    loss_fn: Callable[[Any, Any], Any]
    """(output of the last layer, target) -> scalar loss tensor."""
    input_bytes_per_sample: int
    """Bytes of one sample of the model input (what the first stage receives per sample)."""
    input_meta: dict[str, str] | None = None
    """Profile metadata describing the input (input_shape, input_dtype, vocab) of a model that
    chose it itself (`hf:`), so that `pplan run` rebuilds the same one; None otherwise."""
