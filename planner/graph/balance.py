"""Which modules a traced model's grouping sees through, so that no layer is most of the model.

Grouped by the modules `forward` calls at the top level, a model whose blocks sit in one
container (`self.encoder = nn.TransformerEncoder(...)`, torchvision's ViT `encoder`, a ResNet's
`layer4`) gets one pipeline layer holding nearly all its weights, and no plan can cut between
its blocks. So, repeatedly, the layer holding more than half of the parameters is split into
the modules it calls (its glue joins the layer running when it is reached) when that spreads
its weights: no new layer keeps nine tenths of them (looking through a part that holds nearly
all of them, as torchvision's ViT `encoder` holds its `layers`). Twelve equal blocks, each a
twelfth, spread; the rule was once "two new layers hold a tenth each", which no block of eleven
or more does, so BERT-base's and ViT-B's encoders stayed one layer. A heavy layer that is
one big weight and an activation (`nn.Sequential(nn.Linear(...), nn.Tanh())`) stays whole, as
does one whose split would run a BatchNorm in two layers. A model whose parameters are spread
over its top-level modules keeps its layers as they are.
"""

from __future__ import annotations

from typing import Callable

from torch import nn

from planner.errors import ModelSpecError

__all__ = ["balanced", "HEAVY", "SPREAD"]

HEAVY = 0.5
"""Share of the model's parameters above which a layer is split into the modules it calls."""
SPREAD = 0.1
"""The split spreads the heavy layer's parameters when its largest part holds at most 1 - SPREAD of them."""


def _size(module: nn.Module, path: str, expanded: frozenset[str]) -> int:
    # a seen-through module's own layer (its glue) holds only its direct parameters
    return sum(p.numel() for p in module.get_submodule(path).parameters(recurse=path not in expanded))


def balanced(module: nn.Module, group: Callable[[frozenset[str]], list[str]]) -> frozenset[str]:
    """The module paths to see through; `group(expanded)` returns the layers' module paths
    grouped that way (planner.graph.trace.group_nodes), raising ModelSpecError when it cannot."""
    total = sum(p.numel() for p in module.parameters())
    expanded: frozenset[str] = frozenset()
    tried: set[str] = set()
    while total:
        size = {k: _size(module, k, expanded) for k in set(group(expanded)) - tried}
        heavy = max(size, key=lambda k: (size[k], k), default=None)
        if heavy is None or size[heavy] <= HEAVY * total:
            break
        tried.add(heavy)
        expanded = _spread(module, group, expanded, heavy, size[heavy]) or expanded
    return expanded


def _spread(module: nn.Module, group: Callable[[frozenset[str]], list[str]], expanded: frozenset[str], heavy: str,
            weight: int) -> frozenset[str] | None:
    """`expanded` plus `heavy` and, when one of its parts still holds nearly all of `weight`
    (torchvision's ViT `encoder` around its `layers`), that part too, recursively; None when
    that never spreads `weight` over two layers."""
    finer = expanded | {heavy}
    try:
        parts = {k: _size(module, k, finer) for k in group(finer) if k == heavy or k.startswith(heavy + ".")}
    except ModelSpecError:
        return None  # its parts would run a BatchNorm in two layers: it stays one layer
    if len(parts) >= 2 and max(parts.values()) <= (1.0 - SPREAD) * weight:
        return finer
    top = max(parts, key=lambda k: (parts[k], k), default=heavy)
    return None if top in finer else _spread(module, group, finer, top, weight)
