"""A traced model as an `nn.Sequential` that runs layer by layer: ModelBundle.layers of a non-chain model.

`as_sequential(lg)` turns a LayerGraph into a `GraphSequential`: child i runs layer i, and
what passes from child i to child i+1 is a dict {value name: tensor} of every value that
crosses the cut after layer i, which is exactly what `crossing_bytes` charges (values no
later layer reads are dropped there). Child 0 takes the model input (a tensor, or a tuple
when forward takes several), the last child returns the model output. So:

- `layers(x)` is the model's forward, and code that calls `bundle.layers(x)` (warm-up, the
  single-process reference run) or walks `layers.children()` (parameters, state dicts,
  `.to()`, `.train()`) works unchanged;
- each child is an fx GraphModule whose parameters are the original model's objects under
  their original names: child i's state dict has the keys the user's model has for layer i
  (`enc1.0.weight`), so per-layer state dicts map back;
- `layers.graph` is the LayerGraph (names, skip edges, `layer_module`, `run_layer`) for code
  that must know the model is not a chain: the profiler measures each layer through it;
- `layers.source` is the user's module itself (not a registered child, so it adds no layer
  and no parameters twice): what `pipeline()` must export for a run, since torch cannot
  re-export the traced GraphModule with split_policy's relays.

A child handed a tensor where it expects the dict (an executor cutting the Sequential as if
it were a chain) raises ModelSpecError pointing at pipeline() + split_policy (docs/graph.md).
Child names are the layer names with non-identifier characters replaced (`layer1.0` ->
`layer1_0`): nn.Module names cannot contain dots.
"""

from __future__ import annotations

import operator
import re
from collections import OrderedDict
from typing import Any

import torch.fx as fx
from torch import nn

from planner.errors import ModelSpecError
from planner.graph.layers import LayerGraph

__all__ = ["GraphSequential", "as_sequential", "live_after"]


class GraphSequential(nn.Sequential):
    """nn.Sequential of a traced model's layers passing {name: value} dicts (module docstring)."""

    graph: LayerGraph | None = None
    """The LayerGraph the children were made from (None on a slice of one)."""
    source: nn.Module | None = None
    """The traced nn.Module (kept out of the children: it shares their parameters)."""


def live_after(lg: LayerGraph, i: int) -> tuple[str, ...]:
    """Names of the values that cross the cut after layer i (made at or before i, read after it)."""
    return tuple(v.name for v in lg.values if v.producer <= i < max(v.consumers))


def _expect_env(env: Any, layer: int, name: str) -> dict:
    # Called from the generated code of every child after the first.
    if not isinstance(env, dict):
        raise ModelSpecError(
            f"layer {layer} ({name}) of a traced non-chain model got {type(env).__name__}, not the dict of values crossing the cut before it",
            "run such a model's stages with torch.distributed.pipelining.pipeline() and planner.graph.split_policy (docs/graph.md)")
    return env


def _child(lg: LayerGraph, i: int) -> fx.GraphModule:
    """Layer i as a GraphModule: forward(env) -> env after layer i (or the model output)."""
    by_name = {nd.name: nd for nd in lg.module.graph.nodes}
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    keep = live_after(lg, i) if i < lg.n_layers - 1 else ()
    if i == 0:
        if len(lg.input_names) == 1:
            env[by_name[lg.input_names[0]]] = graph.placeholder(lg.input_names[0])
        else:
            packed = graph.placeholder("inputs")
            for k, name in enumerate(lg.input_names):
                env[by_name[name]] = graph.call_function(operator.getitem, (packed, k))
    else:
        packed = graph.call_function(_expect_env, (graph.placeholder("env"), i, lg.names[i]))
        own = set(lg.fx_nodes[i])
        wanted = list(lg.layer_inputs(i)) + [n for n in keep if n not in own and n not in lg.layer_inputs(i)]
        for name in wanted:
            env[by_name[name]] = graph.call_function(operator.getitem, (packed, name))
    result: Any = None
    for name in lg.fx_nodes[i]:
        nd = by_name[name]
        if nd.op == "placeholder":
            continue  # layer 0's inputs were made above
        if nd.op == "output":
            result = fx.map_arg(nd.args[0], lambda a: env[a])
            continue
        env[nd] = graph.node_copy(nd, lambda a: env[a])
    if result is None:
        result = {name: env[by_name[name]] for name in keep}
    graph.output(result)
    return fx.GraphModule(lg.module, graph, class_name="Env" + re.sub(r"\W", "_", f"{i}_{lg.names[i]}"))


def _child_names(names: tuple[str, ...]) -> list[str]:
    out: list[str] = []
    for i, name in enumerate(names):
        safe = re.sub(r"\W", "_", name) or f"layer{i}"
        out.append(safe if safe not in out else f"{safe}_{i}")
    return out


def as_sequential(lg: LayerGraph, source: nn.Module | None = None) -> GraphSequential:
    """The GraphSequential of `lg` (module docstring); parameters shared with the traced model.

    `source` is the module `lg` was traced from, kept as `.source` without registering it.
    """
    seq = GraphSequential(OrderedDict((n, _child(lg, i)) for i, n in enumerate(_child_names(lg.names))))
    seq.graph = lg
    seq.__dict__["source"] = source  # plain attribute: nn.Module.__setattr__ would make it a child
    return seq
