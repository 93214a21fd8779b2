"""Values that are not tensors (`x.size(0)`, `b, c, h, w = x.shape`, `h * w`) are recomputed by
the layers that read them, never sent across a cut; so are tensors made from them alone
(`shape_only`: a causal mask, positions).

Pipeline stages send tensors only. A traced `forward` often reads a shape in one layer and
uses it in the next (`x = self.features(x); b, c, h, w = x.shape; x = self.mid(x).reshape(b, c, h * w)`):
grouped in program order, the ints belong to the `features` layer and `mid` would need them
across a cut. Instead each layer that reads such a value runs its (cheap, tensor-free)
computation again from the tensors it came from, which then cross the cut in its place (here
`x` crosses anyway). Only plain function and method calls are recomputed: a module call that
returns a non-tensor still crosses (and the executor refuses to send it).
"""

from __future__ import annotations

from collections import defaultdict

import torch.fx as fx

__all__ = ["recomputed_scalars", "readers", "shape_only"]

_RECOMPUTABLE = ("call_function", "call_method")
# calls whose result a second run would not reproduce (random draws, uninitialised memory)
_RANDOM = {"rand", "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like", "bernoulli", "normal",
           "multinomial", "poisson", "dropout", "empty", "empty_like", "empty_strided", "uniform_", "normal_"}


def shape_only(nodes: list[fx.Node], static: set[str]) -> set[str]:
    """`static` (values holding no tensor) plus the tensors computed from those alone, such as a
    causal mask `torch.triu(torch.ones(T, T, device=x.device), 1)` or positions
    `torch.arange(T)`: cheap to compute again and the same every time, so recomputed like
    shapes rather than sent (a mask has no batch dimension to split into micro-batches)."""
    out = set(static)
    for nd in nodes:
        name = getattr(nd.target, "__name__", nd.target)
        if nd.op in _RECOMPUTABLE and name not in _RANDOM and nd.all_input_nodes \
                and all(a.name in out and a.op != "placeholder" for a in nd.all_input_nodes):
            out.add(nd.name)
    return out


def recomputed_scalars(nodes: list[fx.Node], layer_of: dict[fx.Node, int], static: set[str]) -> dict[fx.Node, set[int]]:
    """Non-tensor nodes (names in `static`) read by a later layer -> the later layers that
    recompute them, with the non-tensor nodes they are made from (transitively)."""
    extra: dict[fx.Node, set[int]] = defaultdict(set)

    def need(nd: fx.Node, layer: int) -> None:
        if layer == layer_of.get(nd) or layer in extra[nd]:
            return
        extra[nd].add(layer)
        for a in nd.all_input_nodes:
            if _recomputable(a, layer_of, static):
                need(a, layer)

    for nd in nodes:
        if nd not in layer_of:
            continue
        for a in nd.all_input_nodes:
            if _recomputable(a, layer_of, static) and layer_of[a] != layer_of[nd]:
                need(a, layer_of[nd])
    return {nd: layers for nd, layers in extra.items() if layers}


def _recomputable(nd: fx.Node, layer_of: dict[fx.Node, int], static: set[str]) -> bool:
    return nd.op in _RECOMPUTABLE and nd.name in static and nd in layer_of


def readers(nd: fx.Node, layer_of: dict[fx.Node, int], extra: dict[fx.Node, set[int]]) -> set[int]:
    """Layers that run a user of `nd` (its own layer, or a layer recomputing that user)."""
    out: set[int] = set()
    for u in nd.users:
        if u in layer_of:
            out.add(layer_of[u])
        out |= extra.get(u, set())
    return out
