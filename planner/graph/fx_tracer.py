"""The torch.fx tracer behind planner.graph.trace: fx's own, with what users' models need.

- `opaque`: modules at the grouping depth are recorded as one call (their forward is not traced).
- `nn.TransformerEncoder` is traced as its loop over layers (no masks), so the grouping can cut
  between its blocks; with a mask argument it stays one call.
- `torch.ones(t, t)`, `arange`, `triu`, ... on a traced int (`t = x.size(1)`) are recorded as
  calls: fx alone fails, a Proxy being no int.
- forward's parameters beyond the example's arguments that have defaults (`mask=None`,
  `return_features=False`) are traced as those defaults, as a call with only the example runs,
  and leave no input behind.
"""

from __future__ import annotations

import inspect
import operator
from typing import Any

import torch
import torch.fx as fx
from torch import nn

__all__ = ["trace_graph"]


_SPECIALIZATION_CHECKS = {torch.fx._symbolic_trace._assert_is_none, torch._assert, operator.eq}
_FACTORIES = ("ones", "zeros", "full", "empty", "arange", "eye", "tril", "triu", "linspace", "rand", "randn", "randint")


class _Tracer(fx.Tracer):
    """fx's tracer; with `opaque`, modules at the grouping depth are recorded as one call."""

    def __init__(self, depth: int, opaque: bool):
        super().__init__()
        self.depth, self.opaque = depth, opaque
        # torch.ones(T, T) with T = x.size(1) fails in fx (a Proxy is no int): recorded as calls instead
        self._autowrap_function_ids |= {id(getattr(torch, name)) for name in _FACTORIES}
        self._autowrap_search.append(torch)

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        # module_stack already holds the module being called: its length is its call depth.
        if self.opaque and len(self.module_stack) >= self.depth:
            return True
        if isinstance(m, nn.TransformerEncoder) and not self.opaque:
            return False  # traced as its loop over layers (call_module), so it can be cut between them
        return super().is_leaf_module(m, module_qualified_name)

    def call_module(self, m: nn.Module, forward: Any, args: tuple, kwargs: dict) -> Any:
        if isinstance(m, nn.TransformerEncoder) and not self.opaque:
            if len(args) != 1 or any(v not in (None, False) for v in kwargs.values()):
                return self.create_proxy("call_module", self.path_of_module(m), args, kwargs)  # masks: one call, as fx records it
            forward = lambda src: _encoder_loop(m, src)  # noqa: E731 - its training path without masks
        return super().call_module(m, forward, args, kwargs)


def _encoder_loop(encoder: nn.TransformerEncoder, src: Any) -> Any:
    """nn.TransformerEncoder.forward without masks, as it runs when training: each layer, then the norm."""
    for layer in encoder.layers:
        src = layer(src)
    return encoder.norm(src) if encoder.norm is not None else src


def _defaults_beyond(module: nn.Module, n_args: int) -> dict[str, Any]:
    """forward's parameters after the `n_args` given ones that have defaults (`mask=None`,
    `return_features=False`): traced as those values, as a call with `n_args` arguments runs."""
    params = [p for p in inspect.signature(module.forward).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return {p.name: p.default for p in params[n_args:] if p.default is not p.empty}


def _drop_specialized(graph: fx.Graph, n_args: int) -> None:
    """Remove the placeholders fx keeps for specialized defaults, with the checks it adds on them."""
    order = {nd: i for i, nd in enumerate(graph.nodes)}
    for ph in [nd for nd in graph.nodes if nd.op == "placeholder"][n_args:]:
        reach, todo = {ph}, [ph]
        while todo:
            for u in todo.pop().users:
                if u not in reach:
                    reach.add(u)
                    todo.append(u)
        if all(nd is ph or nd.target in _SPECIALIZATION_CHECKS for nd in reach):
            for nd in sorted(reach, key=order.__getitem__, reverse=True):
                graph.erase_node(nd)


def trace_graph(module: nn.Module, depth: int, opaque: bool, n_args: int) -> tuple[nn.Module, fx.Graph]:
    """(root, graph) of `module` called with `n_args` positional arguments (module docstring)."""
    tracer = _Tracer(depth, opaque)
    graph = tracer.trace(module, concrete_args=_defaults_beyond(module, n_args) or None)
    _drop_specialized(graph, n_args)
    for nd in graph.nodes:
        # a wrapped call's code would register `torch.fx.wrap("torch.ones")`, which breaks every later trace
        if nd.meta.get("is_wrapped") and getattr(nd.target, "__name__", None) in _FACTORIES:
            del nd.meta["is_wrapped"]
    return tracer.root, graph
