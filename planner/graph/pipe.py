"""Cutting a model for torch.distributed.pipelining.pipeline() at planned cuts.

A cut after layer c must become a `pipe_split` just before the first program node of layer
c+1. Two ways, checked against each other in tests/test_graph_pipeline.py:

- `split_spec(lg, cuts)` -> {module path: SplitPoint.BEGINNING}, for
  `pipeline(model, mb_args, split_spec=...)`. torch hooks that module's forward, so the
  module that starts layer c+1 must run nowhere else (a reused `nn.MaxPool2d` would split at
  every call); refused with a hint otherwise.
- `split_policy(lg, cuts)` -> a callable for `pipeline(model, mb_args, split_policy=...)`.
  torch hands it the exported (aten-level) graph; it groups that graph by the same rule as
  `trace_layers`, checks it finds the same layers, and inserts the markers itself. Works
  whatever the module reuse, and by default relays skip tensors stage to stage (below).

Skip tensors: torch's stages send an output straight to every stage that reads it, and
torch 2.13 cannot run the backward when one output goes to two or more stages. With
`relay=True` each stage a skip tensor passes hands it on, which is the planner's
hop-by-hop model (`crossing_bytes` on every link, `passthrough_bytes` held on the way).

Both give the original model's parameter names to the stages (state_dict keys unchanged).
"""

from __future__ import annotations

from typing import Callable, Iterable

import torch
import torch.fx as fx
from torch.distributed.pipelining import SplitPoint

from planner.errors import ModelSpecError
from planner.graph.crossing import stage_ranges
from planner.graph.layers import LayerGraph
from planner.graph.trace import group_nodes

__all__ = ["split_spec", "split_policy"]


def split_spec(lg: LayerGraph, cuts: Iterable[int]) -> dict[str, SplitPoint]:
    """split_spec for pipeline(): SplitPoint.BEGINNING at the module that starts each cut's next layer."""
    spec: dict[str, SplitPoint] = {}
    for first, _ in stage_ranges(lg.n_layers, cuts)[1:]:
        path = lg.modules[first]
        others = [i for i, m in enumerate(lg.modules) if m == path and i != first]
        if others:
            raise ModelSpecError(
                f"cannot split before layer {first} ({lg.names[first]!r}) by module: {path!r} also runs as layer(s) {others}",
                "use split_policy(lg, cuts), which marks the split in the exported graph")
        spec[path] = SplitPoint.BEGINNING
    return spec


def split_policy(lg: LayerGraph, cuts: Iterable[int], relay: bool = True) -> Callable[[fx.GraphModule], fx.GraphModule]:
    """split_policy for pipeline(): pipe_split markers before the first node of each cut's next layer.

    With `relay` (default) a tensor that passes over a stage is handed on by that stage (an
    `aten.alias` at the stage's start, consumers further on rewired to it), so every stage
    talks only to its neighbours and each link carries exactly `crossing_bytes`. Without
    it the producer's stage sends straight to every stage that reads the tensor
    (`direct_send_bytes`), which torch 2.13 refuses in backward ("Backward of skip
    connections not supported yet") once one output goes to two or more stages.
    """
    ranges = stage_ranges(lg.n_layers, cuts)
    stage_of = {layer: s for s, (first, end) in enumerate(ranges) for layer in range(first, end)}
    marker = torch.ops.pippy._pipe_split.default  # registered by importing torch.distributed.pipelining

    def policy(gm: fx.GraphModule) -> fx.GraphModule:
        nodes = list(gm.graph.nodes)
        layer_of, names, _, _ = group_nodes(None, nodes, lg.depth, frozenset(lg.expanded))
        if tuple(names) != lg.names:
            raise ModelSpecError(f"the exported graph groups into layers {names[:8]}... but the trace into {list(lg.names[:8])}...",
                                 "trace and export must see the same forward; report this model")
        starts: dict[int, fx.Node] = {}
        for s, (first, _) in enumerate(ranges[1:], start=1):
            start = next(nd for nd in nodes if layer_of.get(nd) == first and nd.op != "placeholder")
            with gm.graph.inserting_before(start):
                starts[s] = gm.graph.call_function(marker, ())
        if relay:
            # torch re-nests each stage by nn_module_stack: a relay belongs to the root module.
            stacked = next(nd for nd in nodes if nd.meta.get("nn_module_stack"))
            root = dict([next(iter(stacked.meta["nn_module_stack"].items()))])
            for nd in nodes:
                if nd not in layer_of or nd.op == "output":
                    continue
                users = {u: stage_of[layer_of[u]] for u in nd.users if u in layer_of}
                _relay(gm.graph, nd, stage_of[layer_of[nd]], users, starts, root)
        gm.recompile()
        return gm

    return policy


def _relay(graph: fx.Graph, value: fx.Node, home: int, user_stages: dict[fx.Node, int],
           starts: dict[int, fx.Node], stack: dict) -> None:
    """Hand `value` on through every stage between its producer and its last reader."""
    current = value
    for s in range(home + 1, max(user_stages.values(), default=home)):
        with graph.inserting_after(starts[s]):
            hop = graph.call_function(torch.ops.aten.alias.default, (current,))
        # Stage metadata (shapes to send and receive) is read from these.
        hop.meta.update({k: current.meta[k] for k in ("val", "tensor_meta") if k in current.meta})
        hop.meta["nn_module_stack"] = stack
        for user, stage in user_stages.items():
            if stage > s:
                user.replace_input_with(current, hop)
        current = hop
