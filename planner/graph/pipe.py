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
  whatever the module reuse.

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


def split_policy(lg: LayerGraph, cuts: Iterable[int]) -> Callable[[fx.GraphModule], fx.GraphModule]:
    """split_policy for pipeline(): pipe_split markers before the first node of each cut's next layer."""
    firsts = [first for first, _ in stage_ranges(lg.n_layers, cuts)[1:]]
    marker = torch.ops.pippy._pipe_split.default  # registered by importing torch.distributed.pipelining

    def policy(gm: fx.GraphModule) -> fx.GraphModule:
        nodes = list(gm.graph.nodes)
        layer_of, names, _, _ = group_nodes(None, nodes, lg.depth)
        if tuple(names) != lg.names:
            raise ModelSpecError(f"the exported graph groups into layers {names[:8]}... but the trace into {list(lg.names[:8])}...",
                                 "trace and export must see the same forward; report this model")
        for first in firsts:
            start = next(nd for nd in nodes if layer_of.get(nd) == first and nd.op != "placeholder")
            with gm.graph.inserting_before(start):
                gm.graph.call_function(marker, ())
        gm.recompile()
        return gm

    return policy
