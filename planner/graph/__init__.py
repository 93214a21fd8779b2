"""Models that are not a chain: layers from a torch.fx trace, skip edges, bytes across cuts.

Pure parts (import without torch, networkx or matplotlib; safe for partition/simulate):
  edges     SkipEdge, the profile's `# edge:` lines (edge_lines, read_edges, add_edge_lines)
  crossing  crossing_bytes, passthrough_bytes, layer_input_bytes(s), direct_send_bytes, stage_ranges
  layers    LayerGraph, Value (data types)
Torch parts, imported on first use of their names:
  trace     trace_layers(module, example_input) -> LayerGraph
  pipe      split_spec / split_policy for torch.distributed.pipelining.pipeline()
  sequential  as_sequential(lg) -> GraphSequential: ModelBundle.layers of a non-chain model
docs/graph.md describes the grouping rule, the format extension and the integration.
"""

from __future__ import annotations

from typing import Any

from planner.graph.crossing import crossing_bytes, direct_send_bytes, layer_input_bytes, layer_inputs, passthrough_bytes, stage_ranges
from planner.graph.edges import EDGE_KEY, SkipEdge, add_edge_lines, as_skip_edges, edge_lines, read_edges
from planner.graph.layers import OUTPUT, LayerGraph, Value

__all__ = [
    "EDGE_KEY", "OUTPUT", "GraphSequential", "LayerGraph", "SkipEdge", "Value",
    "add_edge_lines", "as_sequential", "as_skip_edges", "crossing_bytes", "direct_send_bytes",
    "edge_lines", "layer_input_bytes", "layer_inputs", "split_policy", "passthrough_bytes", "read_edges", "split_spec",
    "stage_ranges", "trace_layers",
]

_LAZY = {
    "trace_layers": "planner.graph.trace",
    "split_spec": "planner.graph.pipe",
    "split_policy": "planner.graph.pipe",
    "as_sequential": "planner.graph.sequential",
    "GraphSequential": "planner.graph.sequential",
}


def __getattr__(name: str) -> Any:
    # torch and matplotlib load only when these are used, so planning code stays fast.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'planner.graph' has no attribute {name!r}")
