"""trace_layers: torch.fx trace of any nn.Module, grouped into pipeline layers, with tensor bytes.

Grouping rule (docs/graph.md explains it with examples). Walk the traced program in order:
- Each node that runs inside a submodule belongs to the *outermost called* submodule
  (`depth=1`; with depth=k the k-th outermost, so `layer1.0` instead of `layer1`). A new layer
  starts whenever that module differs from the current layer's: a layer is one uninterrupted
  run of one module's calls (two consecutive calls of one module are one layer).
- Free operations at the top level of `forward` (`x + y`, `torch.cat`, `F.relu`, `.view`)
  join the layer that is running when they are reached, i.e. that of the nearest preceding
  module call; those before the first module call join layer 0. With depth=k, glue code
  inside an outer module between its depth-k children joins the running layer too.
- The model's inputs belong to layer 0 and its output to the last layer.
- A value that is not a tensor (`x.size(0)`, `b, c, h, w = x.shape`) is computed again by every
  later layer that reads it, never sent (planner.graph.scalars).
- A top-level parameter or buffer (`self.pos`) is read by every layer that uses it, never sent.
- With `balance` (what `module:factory` models get), a layer holding more than half of the
  parameters is split into the modules it calls, repeatedly (planner.graph.balance): a ViT whose
  blocks sit in one `encoder` module gets one layer per block.
So every layer is a contiguous stretch of the program, which is exactly how
`torch.distributed.pipelining.pipeline()` splits a program at `pipe_split()` markers, and a
cut after layer c is a split at the first module call of layer c+1.

A module called in two separate places gives one layer per run, named `pool`, `pool@2`, ...
Its parameters are shared by those layers (the same Parameter objects, as tied embeddings
are): stages on different ranks each hold them and `pplan run` sums their gradients before
every optimizer step. A module that keeps running statistics (BatchNorm) is refused instead:
each stage would update its own copy, where one process updates one copy twice.

Bytes are measured by running the traced graph once on `example_input` (no_grad, eval mode,
restored afterwards) and divided by its batch size (the first dimension of the first tensor).
"""

from __future__ import annotations

import operator
from collections import defaultdict
from typing import Any

import networkx as nx
import torch
import torch.fx as fx
from torch import nn
from torch.utils._pytree import tree_leaves

from planner.errors import ModelSpecError
from planner.graph.edges import SkipEdge
from planner.graph.fx_tracer import trace_graph
from planner.graph.layer_module import build_layer_module
from planner.graph.layers import LayerGraph, Value
from planner.graph.balance import balanced
from planner.graph.scalars import readers, recomputed_scalars, shape_only

__all__ = ["trace_layers", "build_layer_module", "group_nodes", "out_of_place_graph"]

_MESSAGE_LIMIT = 300


def _short(e: BaseException) -> str:
    text = " ".join(f"{type(e).__name__}: {e}".split())
    return text[:_MESSAGE_LIMIT] + ("..." if len(text) > _MESSAGE_LIMIT else "")


def _stack_paths(node: fx.Node) -> list[str]:
    stack = node.meta.get("nn_module_stack") or {}
    paths = [entry[0] if isinstance(entry, tuple) else str(entry) for entry in stack.values()]
    paths = [p for p in paths if p]  # torch.export adds the root module as ''
    if not paths and node.op == "call_module":
        paths = [str(node.target)]
    return paths


def _key(node: fx.Node, depth: int, current: str | None, expanded: frozenset[str] = frozenset()) -> str | None:
    """The module path that owns `node`, or None for top-level glue (see module docstring);
    an `expanded` module is seen through: its called submodules own their nodes."""
    paths = _stack_paths(node)
    if not paths:
        return None
    k = depth - 1
    while k < len(paths) and paths[k] in expanded:
        k += 1
    if k < len(paths):
        return paths[k]
    if current is not None and current.startswith(paths[-1] + "."):
        return None  # glue inside an outer module, between its depth-k children
    return paths[-1]


def _running_stats(module: nn.Module | None, path: str) -> str | None:
    """Type name of a submodule of `path` that updates running statistics in training, if any."""
    if module is None:
        return None
    try:
        sub = module.get_submodule(path)
    except AttributeError:
        return None
    for m in sub.modules():
        if isinstance(m, nn.modules.batchnorm._NormBase) and m.track_running_stats:
            return type(m).__name__
    return None


def group_nodes(module: nn.Module | None, nodes: list[fx.Node], depth: int,
                expanded: frozenset[str] = frozenset()) -> tuple[dict[fx.Node, int], list[str], list[str], list[fx.Node]]:
    """(layer of each node, layer names, layer module paths, top-level parameter reads).

    `module` (None: skip the check) is asked whether a re-run module keeps running statistics.
    """
    layer_of: dict[fx.Node, int] = {}
    keys: list[str] = []
    names: list[str] = []
    runs_of: dict[str, list[int]] = defaultdict(list)
    shared: list[fx.Node] = []
    for node in nodes:
        if node.op == "placeholder":
            layer_of[node] = 0
            continue
        if node.op == "output":
            continue
        key = _key(node, depth, keys[-1] if keys else None, expanded)
        if key is None:
            if node.op == "get_attr":
                shared.append(node)
            else:
                layer_of[node] = max(len(keys) - 1, 0)
            continue
        if not keys or key != keys[-1]:
            stats = _running_stats(module, key) if runs_of[key] else None
            if stats is not None:
                first = runs_of[key][0]
                raise ModelSpecError(
                    f"module {key!r} ({stats} inside) is called in two separate places (layer {first} {names[first]!r} and layer {len(keys)}): "
                    "pipeline stages would each update their own running statistics, where one process updates one copy twice",
                    f"give each place its own {stats} (shared weights without running statistics are fine: their gradients are summed)")
            runs_of[key].append(len(keys))
            names.append(key if len(runs_of[key]) == 1 else f"{key}@{len(runs_of[key])}")
            keys.append(key)
        layer_of[node] = len(keys) - 1
    if not keys:
        raise ModelSpecError(f"{type(module).__name__ if module is not None else 'the model'}.forward calls no submodule, so it has no layers to pipeline",
                             "build the model from child modules (nn.Module attributes) and call them in forward")
    for node in nodes:
        if node.op == "output":
            layer_of[node] = len(keys) - 1
    return layer_of, names, keys, shared


def _nbytes(value: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tree_leaves(value) if isinstance(t, torch.Tensor))


class _Sizer(fx.Interpreter):
    """Runs the graph once, recording the bytes of the wanted nodes' outputs."""

    def __init__(self, gm: fx.GraphModule, wanted: set[str]):
        super().__init__(gm)
        self.extra_traceback = False  # its graph dump on failure takes seconds; the error names the op
        self.wanted = wanted
        self.sizes: dict[str, int] = {}
        self.static: set[str] = set()  # nodes whose value holds no tensor (ints, shapes)

    def run_node(self, n: fx.Node) -> Any:
        out = super().run_node(n)
        if n.name in self.wanted:
            self.sizes[n.name] = _nbytes(out)
        if not any(isinstance(t, torch.Tensor) for t in tree_leaves(out)):
            self.static.add(n.name)
        return out


def _measure(gm: fx.GraphModule, args: tuple, wanted: set[str], model: str) -> tuple[dict[str, int], set[str]]:
    modes = [(m, m.training) for m in gm.modules()]
    try:
        gm.eval()  # eval: a size pass must not move BatchNorm running statistics
        with torch.no_grad():
            sizer = _Sizer(gm, wanted)
            sizer.run(*args)
    except Exception as e:
        raise ModelSpecError(f"the traced {model} fails on the example input: {_short(e)}", "check the example input's shape and dtype") from None
    finally:
        for m, training in modes:
            m.training = training
    return sizer.sizes, sizer.static


def _per_sample(nbytes: int, batch: int) -> int:
    return int(round(nbytes / batch))


_INPLACE_OPERATORS = {operator.iadd: operator.add, operator.isub: operator.sub, operator.imul: operator.mul,
                      operator.itruediv: operator.truediv, operator.ifloordiv: operator.floordiv,
                      operator.ipow: operator.pow, operator.iand: operator.and_, operator.ior: operator.or_}
# in-place methods that have no out-of-place twin of the same signature
_KEEP_INPLACE = {"requires_grad_", "share_memory_", "copy_", "set_", "zero_", "fill_", "resize_", "uniform_",
                 "normal_", "random_", "bernoulli_", "exponential_", "geometric_", "cauchy_", "log_normal_", "index_put_"}


def out_of_place_graph(graph: fx.Graph) -> int:
    """Rewrite in-place calls (`x += y`, `x.relu_()`, `F.relu(x, inplace=True)`) as their
    out-of-place twins: the same values, and a layer may then take a received tensor (a leaf
    that requires grad, on which autograd refuses in-place ops). Returns the count."""
    changed = 0
    for nd in graph.nodes:
        if nd.op == "call_function" and nd.target in _INPLACE_OPERATORS:
            nd.target = _INPLACE_OPERATORS[nd.target]
            changed += 1
        elif nd.op == "call_function" and isinstance(getattr(nd.target, "__name__", None), str):
            name = nd.target.__name__
            if name.endswith("_") and not name.startswith("_") and name not in _KEEP_INPLACE and hasattr(torch, name[:-1]) \
                    and getattr(torch, name, None) is nd.target:
                nd.target = getattr(torch, name[:-1])
                changed += 1
        elif nd.op == "call_method" and isinstance(nd.target, str) and nd.target.endswith("_") \
                and not nd.target.startswith("_") and nd.target not in _KEEP_INPLACE and hasattr(torch.Tensor, nd.target[:-1]):
            nd.target = nd.target[:-1]
            changed += 1
        if nd.op in ("call_function", "call_method") and nd.kwargs.get("inplace") is True:
            nd.kwargs = {**nd.kwargs, "inplace": False}
            changed += 1
    return changed


def _symbolic_trace(module: nn.Module, depth: int, opaque: bool, n_args: int) -> fx.GraphModule:
    root, graph = trace_graph(module, depth, opaque, n_args)
    out_of_place_graph(graph)
    return fx.GraphModule(root, graph, type(module).__name__)


def _check_positional(model: str, args: tuple[Any, ...]) -> None:
    """Refuse an input that is a container (a dict batch, a nested tuple): a pipeline stage
    receives and sends its inputs as positional tensors, so the traced forward must take them so."""
    for i, a in enumerate(args):
        if isinstance(a, (dict, tuple, list)):
            what = (f"a dict (keys {', '.join(map(repr, list(a)[:4]))}{', ...' if len(a) > 4 else ''})"
                    if isinstance(a, dict) else f"a {type(a).__name__} of {len(a)}")
            raise ModelSpecError(
                f"{model}.forward's input {i} is {what}: a pipeline stage passes its inputs as positional tensors",
                "take each tensor as an argument, e.g. forward(self, input_ids, attention_mask), and have make_batch "
                "return ((input_ids, attention_mask), target) (docs/models.md, 'The input contract')")


def trace_layers(module: nn.Module, example_input: Any, depth: int = 1, opaque: bool = False, balance: bool = False) -> LayerGraph:
    """Trace `module` with torch.fx and group its program into layers (module docstring).

    `example_input` is a tensor or a tuple of positional tensors whose first dimension is
    the batch (a dict or a nested tuple is refused with what works instead). `opaque=True` records each layer module as one call instead of tracing into
    it: for layer modules whose own forward fx cannot trace. Raises ModelSpecError (one
    line) when fx cannot trace the forward (data-dependent control flow), the example
    fails, a module with running statistics runs in two layers, or forward calls no submodule.
    """
    if depth < 1:
        raise ModelSpecError(f"grouping depth {depth} must be at least 1")
    args = tuple(example_input) if isinstance(example_input, (tuple, list)) else (example_input,)
    model = type(module).__name__
    _check_positional(model, args)
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if not tensors or tensors[0].dim() == 0 or tensors[0].shape[0] < 1:
        raise ModelSpecError("the example input needs a tensor whose first dimension is the batch (>= 1)")
    batch = int(tensors[0].shape[0])
    try:
        gm = _symbolic_trace(module, depth, opaque, len(args))
    except Exception as e:
        raise ModelSpecError(f"torch.fx cannot trace {model}.forward: {_short(e)}",
                             "remove data-dependent control flow (if/for on tensor values) from forward; if it is inside the layer modules, trace with opaque=True") from None

    nodes = list(gm.graph.nodes)
    expanded = balanced(module, lambda seen: group_nodes(module, nodes, depth, seen)[2]) if balance else frozenset()
    layer_of, names, keys, shared = group_nodes(module, nodes, depth, expanded)
    n = len(names)
    placeholders = [nd for nd in nodes if nd.op == "placeholder"]
    if len(placeholders) != len(args):
        raise ModelSpecError(f"{model}.forward takes {len(placeholders)} input(s) but the example gives {len(args)}")
    output = next(nd for nd in nodes if nd.op == "output")

    sizes, static = _measure(gm, args, {nd.name for nd in nodes}, model)
    extra = recomputed_scalars(nodes, layer_of, shape_only(nodes, static))  # shapes, ints, masks: recomputed, not sent
    crossing = _crossing_values(nodes, layer_of, extra)
    values = tuple(Value(nd.name, layer_of[nd], cons, _per_sample(sizes[nd.name], batch)) for nd, cons in crossing.items())
    chain, skip = _chain_and_skips(values, n, _per_sample(sizes[output.name], batch))
    fx_nodes = _fx_nodes_per_layer(nodes, layer_of, shared, n, extra)
    g = _layer_digraph(names, keys, fx_nodes, values)

    return LayerGraph(
        names=tuple(names),
        modules=tuple(keys),
        fx_nodes=tuple(tuple(f) for f in fx_nodes),
        graph=g,
        skip_edges=skip,
        output_bytes_per_sample=tuple(chain),
        input_bytes_per_sample=_per_sample(sum(_nbytes(a) for a in args), batch),
        input_names=tuple(p.name for p in placeholders),
        values=values,
        batch_size=batch,
        depth=depth,
        expanded=tuple(sorted(expanded)),
        module=gm,
    )


def _crossing_values(nodes: list[fx.Node], layer_of: dict[fx.Node, int], extra: dict[fx.Node, set[int]]) -> dict[fx.Node, tuple[int, ...]]:
    """Each fx value read by a later layer than the one computing it -> those layers, ascending
    (a layer that recomputes a shape from it reads it; one that recomputes it does not)."""
    crossing: dict[fx.Node, tuple[int, ...]] = {}
    for nd in nodes:
        if nd in layer_of and nd.op != "output":
            consumers = sorted(readers(nd, layer_of, extra) - {layer_of[nd]} - extra.get(nd, set()))
            if consumers and consumers[0] < layer_of[nd]:  # impossible for a program-order grouping
                raise RuntimeError(f"internal: {nd.name} in layer {layer_of[nd]} feeds earlier layer {consumers[0]}")
            if consumers:
                crossing[nd] = tuple(consumers)
    return crossing


def _chain_and_skips(values: tuple[Value, ...], n: int, output_bytes: int) -> tuple[list[int], tuple[SkipEdge, ...]]:
    """Bytes per sample each layer hands its successor (the last: the model output), and the
    values that skip ahead, merged per (producer, consumers)."""
    chain = [0] * n
    merged: dict[tuple[int, tuple[int, ...]], int] = defaultdict(int)
    for v in values:
        if v.consumers == (v.producer + 1,):
            chain[v.producer] += v.bytes_per_sample
        else:
            merged[(v.producer, v.consumers)] += v.bytes_per_sample
    chain[n - 1] = output_bytes
    return chain, tuple(sorted(SkipEdge(src, cons[-1], b, cons[:-1]) for (src, cons), b in merged.items()))


def _fx_nodes_per_layer(nodes: list[fx.Node], layer_of: dict[fx.Node, int], shared: Any, n: int,
                        extra: dict[fx.Node, set[int]]) -> list[list[str]]:
    """The fx node names each layer runs, in program order; a shared node (a weight read by
    several layers) is listed under every layer that reads it, a recomputed shape under its
    own layer and every layer that recomputes it (those precede the layer's own nodes)."""
    fx_nodes: list[list[str]] = [[] for _ in range(n)]
    for nd in nodes:
        if nd in layer_of:
            for layer in sorted({layer_of[nd]} | extra.get(nd, set())):
                fx_nodes[layer].append(nd.name)
        elif nd in shared:
            for layer in sorted(readers(nd, layer_of, extra)):
                fx_nodes[layer].append(nd.name)
    return fx_nodes


def _layer_digraph(names: list[str], keys: list[str], fx_nodes: list[list[str]], values: tuple[Value, ...]) -> nx.DiGraph:
    """Layers as nodes; an edge per (producer, consumer) with the bytes per sample crossing it."""
    g = nx.DiGraph()
    for i, name in enumerate(names):
        g.add_node(i, name=name, module=keys[i], fx_nodes=tuple(fx_nodes[i]))
    for v in values:
        for c in v.consumers:
            if g.has_edge(v.producer, c):
                g.edges[v.producer, c]["bytes_per_sample"] += v.bytes_per_sample
                g.edges[v.producer, c]["values"] += (v.name,)
            else:
                g.add_edge(v.producer, c, bytes_per_sample=v.bytes_per_sample, values=(v.name,), skip=c != v.producer + 1)
    return g
