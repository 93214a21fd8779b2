"""Letting a pipeline rank's copy of the model go, but for the layers the rank runs.

Every rank builds the whole model (so all ranks agree on the weights without communicating)
and keeps its stages' layers. Dropping the other layers from the Sequential is not enough for
a Hugging Face model: its layers run the model's own code (planner.models.hf_split), so each of
them keeps the whole transformers model reachable, and with it every other rank's weights
(measured on a 2-rank llama: the rank that runs only the LM head kept the embedding and all
blocks alive too).

The transformers model must stay: its forward is what the rank's layers call, and a rank that
holds blocks but not the embedding still runs the model's prologue once per input shape to
record the blocks' other arguments (positions, rotary tables, masks). Those arguments never
depend on a weight (`check_split` refuses a cut where they would), so the weights no kept layer
holds are replaced by placeholders: the same shape and dtype, every element 0, one element of
storage (a stride-0 view). A prologue then still computes hidden states of the right shape, and
every other released module is never called on this rank (its blocks are replaced by a recorder
while recording, and the epilogue runs only where the head is kept).
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

__all__ = ["release_other_layers", "hollow_parameters"]


def release_other_layers(layers: nn.Module, kept: Iterable[torch.Tensor]) -> int:
    """Drop every layer of `layers` (the rank's stages hold the ones it runs) and empty the weights
    of the model they were cut from (`layers.source`, a Hugging Face or traced model) that are not
    among `kept`, the parameters of this rank's stages. Returns the bytes of storage released
    from the source model (0 without one)."""
    source = layers.__dict__.get("source")
    layers._modules.clear()
    if source is None:
        return 0
    layers.__dict__["source"] = None
    return hollow_parameters(source, kept) if isinstance(source, nn.Module) else 0


def hollow_parameters(model: nn.Module, kept: Iterable[torch.Tensor]) -> int:
    """Replace each parameter of `model` that is not one of `kept` (by identity) with a zero
    placeholder of its shape and dtype that holds one element (module docstring), in every module
    that registers it (a tied weight is registered twice). Returns the bytes no longer held."""
    keep = {id(p) for p in kept}
    placeholders: dict[int, nn.Parameter] = {}
    released = 0
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is None or id(param) in keep or _is_placeholder(param):
                continue
            if id(param) not in placeholders:
                released += param.numel() * param.element_size()
                placeholders[id(param)] = _placeholder(param)
            # not setattr: a module may guard its own parameters' assignment (parametrizations)
            module._parameters[name] = placeholders[id(param)]
    return released


def _placeholder(param: torch.Tensor) -> nn.Parameter:
    # no gradient: nothing on this rank trains a weight another rank holds
    zero = torch.zeros((), dtype=param.dtype, device=param.device)
    return nn.Parameter(zero.expand(param.shape), requires_grad=False)


def _is_placeholder(param: torch.Tensor) -> bool:
    return param.numel() > 1 and all(s == 0 for s in param.stride())
