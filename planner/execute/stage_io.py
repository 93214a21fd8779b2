"""What crosses each cut and what each stage receives and returns, found by forwards at set-up.

Every rank runs one micro-batch of the model input (`example`) through the whole model, twice:

- `boundary_specs`: layer by layer in eval mode without gradients, the structure of what crosses
  each cut (tensors, tuples, a traced model's dicts), which the stages flatten to send and rebuild.
- `stage_examples`: stage by stage, each stage the module the run wraps (its PipeStage), what it
  receives and returns, for torch's PipelineStage. Given no example tensors, torch 2.13's stage
  learns this at the first step by running every stage once (its dynamic metadata inference),
  each non-first stage on placeholder tensors (torch.empty): token ids crossing a cut are then
  arbitrary integers and an embedding after the cut indexes out of range; a module that checks
  its input (I-BERT's QuantAct) fails its own assertion. Given input_args and output_args on
  every stage, the ranks' warm-up vote picks torch's static mode (only when every stage of every
  rank has both), which runs no set-up forward: each stage allocates its receive buffers
  (activations, and gradients of the outputs that require grad) from these tensors' shape,
  stride, dtype and requires_grad, so they must be those of the run's own tensors. Hence the
  first stage gets the model input as the schedule passes it, every other one the previous
  stage's outputs as fresh leaves that require grad where those outputs do (torch's receive
  buffers), in grad mode and in the modules' own (training) modes, as the run computes them and
  as torch's dynamic inference did: a model whose output differs between modes gets the
  tensors of training. One stage's graph is alive at a time.

Neither forward changes training: modes, random generators and buffers are put back (`buffers_kept`).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

import torch
from torch import nn

__all__ = ["buffers_kept", "boundary_specs", "StageExample", "stage_examples"]


@contextmanager
def buffers_kept(module: nn.Module) -> Iterator[None]:
    """Put every buffer back afterwards, by name too: a module may reassign one instead of updating it in place (I-BERT's x_min)."""
    kept = [(m, n, b, b.detach().clone()) for m in module.modules() for n, b in m._buffers.items() if b is not None]
    try:
        yield
    finally:
        with torch.no_grad():
            for m, n, b, saved in kept:
                m._buffers[n] = b.copy_(saved)


@contextmanager
def _set_up_forward(layers: nn.Module, eval_mode: bool) -> Iterator[None]:
    """A forward of `layers` that leaves training as it found it: every module's mode, random
    generator (the CPU's and those of the GPUs the model is on) and buffer as they were."""
    modes = [(m, m.training) for m in layers.modules()]
    gpus = sorted({t.device.index or 0 for t in [*layers.parameters(), *layers.buffers()] if t.device.type == "cuda"})
    try:
        if eval_mode:
            layers.eval()
        with torch.random.fork_rng(devices=gpus), buffers_kept(layers):
            yield
    finally:
        for m, training in modes:
            m.training = training


def boundary_specs(layers: nn.Sequential, example: Any) -> list[tuple[Any, list[str]]]:
    """Per cut c (after layer c): (pytree spec of what crosses it, type names of non-tensor leaves),
    from one forward of `example` in eval mode without gradients."""
    from torch.utils._pytree import tree_flatten

    children = list(layers.children())
    out: list[tuple[Any, list[str]]] = []
    with _set_up_forward(layers, eval_mode=True), torch.no_grad():
        h = example
        for child in children[:-1]:
            h = child(h)
            leaves, spec = tree_flatten(h)
            out.append((spec, sorted({type(t).__name__ for t in leaves if not isinstance(t, torch.Tensor)})))
    return out


@dataclass(frozen=True)
class StageExample:
    """One micro-batch's tensors at one stage (detached leaves, requires_grad as in training)."""

    inputs: tuple[torch.Tensor, ...]
    """What the stage receives, as torch passes it (the model input's tensors on the first stage)."""
    outputs: tuple[torch.Tensor, ...]
    """What the stage returns, as a tuple (what it sends, or the model output on the last stage)."""

    def on(self, device: torch.device) -> dict[str, tuple[torch.Tensor, ...]]:
        """PipelineStage's input_args and output_args, on `device`."""
        def moved(tensors: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
            return tuple(t.detach().to(device).requires_grad_(t.requires_grad) for t in tensors)

        return {"input_args": moved(self.inputs), "output_args": moved(self.outputs)}


def _tensors(value: Any) -> tuple[torch.Tensor, ...] | None:
    """`value` as the tuple of tensors torch's stages pass (a tensor, or a tuple or list of
    them), else None: no static set-up for it (torch's dynamic one refuses it too)."""
    if isinstance(value, torch.Tensor):
        return (value,)
    if isinstance(value, (tuple, list)) and value and all(isinstance(v, torch.Tensor) for v in value):
        return tuple(value)
    return None


def _leaf(t: torch.Tensor) -> torch.Tensor:
    return t.detach().requires_grad_(t.requires_grad)


def stage_examples(layers: nn.Module, stages: list[nn.Module], example: Any, micro_batch_size: int,
                   wanted: set[int]) -> dict[int, StageExample] | None:
    """Stage index (in `stages`: every stage of the plan over `layers`, in order) -> its
    StageExample, for the indices in `wanted`; None when torch's static set-up cannot take them:
    `example` is not one micro-batch (every tensor `micro_batch_size` samples along dim 0, along
    which the schedule splits the batch: buffers sized by another example would not fit), or the
    model input or the last stage's output is not a tensor or a flat tuple of tensors."""
    inputs = _tensors(example)
    if inputs is None or any(t.dim() == 0 or t.shape[0] != micro_batch_size for t in inputs):
        return None
    found: dict[int, StageExample] = {}
    with _set_up_forward(layers, eval_mode=False), torch.enable_grad():
        for s, stage in enumerate(stages):
            returned = _tensors(stage(*inputs))
            if returned is None:
                return None
            outputs = tuple(_leaf(t) for t in returned)  # frees this stage's graph
            if s in wanted:
                found[s] = StageExample(inputs=tuple(_leaf(t) for t in inputs), outputs=outputs)
            inputs = outputs
    return found
