"""LayerGraph: a traced model as an ordered list of layers and the tensors between them.

Made by `planner.graph.trace.trace_layers`; this module holds only the data type so that
planning code can name it without importing torch or networkx.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from planner.graph.crossing import crossing_bytes
from planner.graph.edges import SkipEdge

if TYPE_CHECKING:  # annotations only
    import networkx
    import torch.fx

__all__ = ["Value", "LayerGraph", "OUTPUT"]

OUTPUT = "output"
"""Name under which the last layer returns the model's output."""


@dataclass(frozen=True)
class Value:
    """One traced value that a layer other than its producer reads."""

    name: str
    """The fx node that makes it (key in `run_layer` environments)."""
    producer: int
    """Layer that computes it (0 for the model's inputs)."""
    consumers: tuple[int, ...]
    """Other layers that read it, ascending (all > producer)."""
    bytes_per_sample: int
    """Bytes of its tensors per sample (elements x element size / example batch size)."""


@dataclass(frozen=True)
class LayerGraph:
    """The layers of a traced model in order, with the bytes that flow between them.

    Layer i runs the fx nodes `fx_nodes[i]` (a contiguous stretch of the traced program,
    plus top-level parameters it reads and ints it recomputes, planner.graph.scalars). `graph` has one node per layer (attributes `name`,
    `module`, `fx_nodes`) and one edge per (producer, consumer) pair with `bytes_per_sample`
    (every tensor the consumer reads from the producer), `values` (their fx names) and
    `skip` (consumer != producer + 1). A tensor read by several layers is on several edges;
    `skip_edges` and `output_bytes_per_sample` count it once, for transfers.
    """

    names: tuple[str, ...]
    """Layer names: the module path (`enc1`, `layer1.0`), `@k` added for its k-th separate run."""
    modules: tuple[str, ...]
    """Module path each layer calls first (the key pipeline split points use)."""
    fx_nodes: tuple[tuple[str, ...], ...]
    """Per layer, the fx node names it runs, in program order (inputs in layer 0, output in the last)."""
    graph: "networkx.DiGraph" = field(compare=False)
    """Layer-level data-flow graph (see class docstring). Treat as read-only."""
    skip_edges: tuple[SkipEdge, ...]
    """Tensors read beyond the next layer, merged per (producer, consumers): the profile's edge lines."""
    output_bytes_per_sample: tuple[int, ...]
    """Per layer, bytes sent only to the next layer (the chain edge); the last: the model output."""
    input_bytes_per_sample: int
    """Bytes of the model inputs per sample."""
    input_names: tuple[str, ...]
    """fx names of the model's inputs (keys for `run_layer(0, env)`)."""
    values: tuple[Value, ...]
    """Every value read outside the layer that made it, in program order."""
    batch_size: int
    """Batch size of the example input the bytes were measured with."""
    depth: int
    """Grouping depth the layers were made with (1: outermost called modules)."""
    module: "torch.fx.GraphModule" = field(compare=False, repr=False)
    """The traced model (shares parameters with the original module)."""
    expanded: tuple[str, ...] = ()
    """Modules the grouping sees through (layers are the modules they call): heavy containers."""
    _layer_modules: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def n_layers(self) -> int:
        return len(self.names)

    def layer_inputs(self, i: int) -> tuple[str, ...]:
        """Names of the values layer i reads from earlier layers (layer 0: the model inputs)."""
        self._check(i)
        if i == 0:
            return self.input_names
        return tuple(v.name for v in self.values if i in v.consumers)

    def layer_outputs(self, i: int) -> tuple[str, ...]:
        """Names of the values layer i makes for later layers (the last layer: ("output",))."""
        self._check(i)
        if i == self.n_layers - 1:
            return (OUTPUT,)
        return tuple(v.name for v in self.values if v.producer == i)

    def layer_module(self, i: int) -> "torch.fx.GraphModule":
        """Layer i as an nn.Module: forward(*inputs in layer_inputs order) -> tuple in layer_outputs order.

        Built once and cached; its parameters are the original module's (count them for
        param_bytes; a top-level parameter read by several layers appears in each).
        """
        self._check(i)
        if i not in self._layer_modules:
            from planner.graph.layer_module import build_layer_module  # lazy: it needs torch.fx

            self._layer_modules[i] = build_layer_module(self, i)
        return self._layer_modules[i]

    def run_layer(self, i: int, env: Mapping[str, Any]) -> dict[str, Any]:
        """Run layer i on live values `env` (name -> value; extra keys ignored).

        Returns {name: value} for `layer_outputs(i)`; a profiler times this with real inputs
        and feeds the results to later layers. KeyError names any missing input.
        """
        names = self.layer_inputs(i)
        missing = [n for n in names if n not in env]
        if missing:
            raise KeyError(f"layer {i} ({self.names[i]}) needs {missing}; env has {sorted(env)}")
        outs = self.layer_module(i)(*[env[n] for n in names])
        return dict(zip(self.layer_outputs(i), outs))

    def crossing_bytes(self, micro_batch_size: int = 1) -> np.ndarray:
        """Bytes crossing each cut (after layer c), hop by hop, per micro-batch of this size."""
        out = np.asarray(self.output_bytes_per_sample, dtype=float) * micro_batch_size
        return crossing_bytes(self.n_layers, out, self.skip_edges, micro_batch_size)

    def _check(self, i: int) -> None:
        if not 0 <= i < self.n_layers:
            raise IndexError(f"layer {i} is out of range 0..{self.n_layers - 1}")
