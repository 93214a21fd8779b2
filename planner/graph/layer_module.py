"""One layer of a traced model as its own runnable fx.GraphModule.

Kept apart from `planner.graph.layers` (the torch-free data type) and from
`planner.graph.trace` (which builds a LayerGraph) so that neither imports the other back:
layers.py reaches this module lazily, and this module needs only the LayerGraph's fields.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import torch.fx as fx

if TYPE_CHECKING:  # annotations only: importing layers here at run time would be a cycle
    from planner.graph.layers import LayerGraph

__all__ = ["build_layer_module"]


def build_layer_module(lg: "LayerGraph", i: int) -> fx.GraphModule:
    """Layer i of `lg` as a GraphModule (see LayerGraph.layer_module)."""
    by_name = {nd.name: nd for nd in lg.module.graph.nodes}
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for name in lg.layer_inputs(i):
        env[by_name[name]] = graph.placeholder(name)
    result: Any = None
    for name in lg.fx_nodes[i]:
        nd = by_name[name]
        if nd.op == "placeholder":
            continue
        if nd.op == "output":
            result = (fx.map_arg(nd.args[0], lambda a: env[a]),)
            continue
        env[nd] = graph.node_copy(nd, lambda a: env[a])
    if result is None:
        result = tuple(env[by_name[name]] for name in lg.layer_outputs(i))
    graph.output(result)
    return fx.GraphModule(lg.module, graph, class_name="Layer" + re.sub(r"\W", "_", f"{i}_{lg.names[i]}"))
