"""trace_layers: the grouping rule, tensor bytes against hand-computed sizes, running layers."""

from __future__ import annotations

from collections import OrderedDict

import networkx as nx
import pytest
import torch
from torch import nn

from planner.errors import ModelSpecError
from planner.graph import SkipEdge, trace_layers
from unet_model import build

F32 = 4
W, IMG, CH, CLASSES = 4, 16, 3, 2  # unet_model.build() defaults


def _unet_sizes() -> dict[str, int]:
    """Bytes per sample of the U-Net's tensors, from its shapes (float32)."""
    s, h, q = IMG * IMG, (IMG // 2) ** 2, (IMG // 4) ** 2
    return {
        "x": CH * s * F32, "e1": W * s * F32, "down1": W * h * F32, "e2": 2 * W * h * F32,
        "down2": 2 * W * q * F32, "m": 4 * W * q * F32, "up2": 2 * W * h * F32,
        "cat2": 4 * W * h * F32, "d2": 2 * W * h * F32, "up1": W * s * F32,
        "cat1": 2 * W * s * F32, "d1": W * s * F32, "out": CLASSES * s * F32,
    }


@pytest.fixture(scope="module")
def unet():
    model = build()
    x, _ = model.make_batch(3, 0)
    return model, x, trace_layers(model, x)


def test_unet_groups_by_top_level_child_with_cat_joining_the_previous_module(unet):
    _, _, lg = unet
    assert lg.names == ("enc1", "down1", "enc2", "down2", "mid", "up2", "dec2", "up1", "dec1", "head")
    assert lg.modules == lg.names
    assert lg.fx_nodes[0][0] == "x" and lg.fx_nodes[-1][-1] == "output"
    assert lg.fx_nodes[5] == ("up2", "cat") and lg.fx_nodes[7] == ("up1", "cat_1")
    assert lg.fx_nodes[2] == tuple(f"enc2_{i}" for i in range(6))
    assert lg.batch_size == 3 and lg.depth == 1
    model, x, _ = unet
    assert trace_layers(model, x) == lg  # deterministic (graph and GraphModule not compared)


def test_unet_edge_bytes_equal_tensor_sizes(unet):
    _, _, lg = unet
    b = _unet_sizes()
    assert lg.skip_edges == (SkipEdge(0, 7, b["e1"], (1,)), SkipEdge(2, 5, b["e2"], (3,)))
    # Chain bytes: only what goes to the next layer alone (e1 and e2 travel on as skips).
    assert lg.output_bytes_per_sample == (0, b["down1"], 0, b["down2"], b["m"], b["cat2"], b["d2"], b["cat1"], b["d1"], b["out"])
    assert lg.input_bytes_per_sample == b["x"]
    g = lg.graph
    assert isinstance(g, nx.DiGraph) and nx.is_directed_acyclic_graph(g)
    assert {(u, v): d["bytes_per_sample"] for u, v, d in g.edges(data=True)} == {
        (0, 1): b["e1"], (0, 7): b["e1"], (1, 2): b["down1"], (2, 3): b["e2"], (2, 5): b["e2"],
        (3, 4): b["down2"], (4, 5): b["m"], (5, 6): b["cat2"], (6, 7): b["d2"], (7, 8): b["cat1"], (8, 9): b["d1"]}
    assert [(u, v) for u, v, d in g.edges(data=True) if d["skip"]] == [(0, 7), (2, 5)]
    assert g.nodes[5]["name"] == "up2" and g.nodes[5]["fx_nodes"] == ("up2", "cat")


def test_unet_crossing_bytes_at_every_cut(unet):
    _, _, lg = unet
    b = _unet_sizes()
    want = [
        b["e1"],                          # cut 0: enc1 | down1 ...
        b["down1"] + b["e1"],             # cut 1
        b["e2"] + b["e1"],                # cut 2: both skips in flight
        b["down2"] + b["e2"] + b["e1"],   # cut 3
        b["m"] + b["e2"] + b["e1"],       # cut 4
        b["cat2"] + b["e1"],              # cut 5: e2 was consumed by up2's cat
        b["d2"] + b["e1"],                # cut 6
        b["cat1"],                        # cut 7: e1 consumed by up1's cat
        b["d1"],                          # cut 8
    ]
    assert lg.crossing_bytes().tolist() == want
    assert lg.crossing_bytes(micro_batch_size=4).tolist() == [4 * v for v in want]


def test_running_the_layers_in_order_reproduces_the_model(unet):
    model, x, lg = unet
    env = {lg.input_names[0]: x}
    for i in range(lg.n_layers):
        outs = lg.run_layer(i, env)
        assert tuple(outs) == lg.layer_outputs(i)
        env.update(outs)
    with torch.no_grad():
        assert torch.equal(env["output"], model(x))
    assert lg.layer_inputs(5) == ("enc2_5", "mid_5") and lg.layer_outputs(5) == ("cat",)
    assert lg.layer_inputs(7) == ("enc1_5", "dec2_5")
    # The measured bytes are those of the live tensors.
    assert env["enc1_5"].numel() * 4 // 3 == _unet_sizes()["e1"]
    # A layer module holds exactly that child's parameters (shared with the model).
    assert {id(p) for p in lg.layer_module(6).parameters()} == {id(p) for p in model.dec2.parameters()}
    with pytest.raises(KeyError, match="needs"):
        lg.run_layer(7, {"enc1_5": env["enc1_5"]})


def test_layer_gradients_flow_like_the_model(unet):
    """Backward through the per-layer modules gives the whole model's gradients."""
    model, x, lg = unet
    model.zero_grad()
    env = {lg.input_names[0]: x}
    for i in range(lg.n_layers):
        env.update(lg.run_layer(i, env))
    env["output"].square().mean().backward()
    mine = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    model(x).square().mean().backward()
    for n, p in model.named_parameters():
        assert torch.allclose(mine[n], p.grad, atol=1e-6), n


def test_a_sequential_chain_has_no_skip_edges():
    class Res(nn.Module):  # a residual inside a layer is not a skip edge
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x):
            return x + torch.relu(self.fc(x))

    seq = nn.Sequential(OrderedDict(inp=nn.Linear(5, 8), r0=Res(), act=nn.ReLU(), r1=Res(), head=nn.Linear(8, 3)))
    x = torch.randn(4, 5)
    lg = trace_layers(seq, x)
    assert lg.names == ("inp", "r0", "act", "r1", "head")
    assert lg.skip_edges == ()
    assert lg.output_bytes_per_sample == (32, 32, 32, 32, 12)
    assert lg.crossing_bytes().tolist() == [32, 32, 32, 32]
    assert [d["skip"] for _, _, d in lg.graph.edges(data=True)] == [False] * 4


@pytest.mark.parametrize("spec", ["mlp:layers=3,hidden=16,input=8", "resnet:stages=2,blocks=1,width=4,image=8"])
def test_builtin_models_trace_as_the_chain_the_profiler_sees(spec):
    from planner.models import build_model

    bundle = build_model(spec)
    x, _ = bundle.make_batch(2, 0)
    lg = trace_layers(bundle.layers, x)
    assert lg.names == tuple(name for name, _ in bundle.layers.named_children())
    assert lg.skip_edges == ()
    with torch.no_grad():
        h, sizes = x, []
        for layer in bundle.layers:
            h = layer(h)
            sizes.append(h.numel() * h.element_size() // 2)
    assert list(lg.output_bytes_per_sample) == sizes


class _TopLevelResidual(nn.Module):
    """stem -> a -> b, with `a`'s residual add at the top level and a skip from stem over a to b."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(4, 6)
        self.a = nn.Linear(6, 6)
        self.b = nn.Linear(6, 6)
        self.head = nn.Linear(6, 2)
        self.scale = nn.Parameter(torch.ones(6))

    def forward(self, x):
        s = self.stem(x * 2.0)           # free op before the first module -> layer 0
        h = s + self.a(s)                # add joins `a` (the module running when it is reached)
        h = self.b(h) * self.scale + s   # s skips over `a`; top-level parameter read by b's layer
        return self.head(h) * self.scale[:2]  # ... and by head's: read by both, never sent


def test_free_ops_join_the_running_layer_and_top_level_parameters_are_not_sent():
    lg = trace_layers(_TopLevelResidual(), torch.randn(5, 4))
    assert lg.names == ("stem", "a", "b", "head")
    assert lg.fx_nodes[0] == ("x", "mul", "stem")
    assert "add" in lg.fx_nodes[1]
    assert "scale" in lg.fx_nodes[2] and "scale" in lg.fx_nodes[3]
    assert lg.skip_edges == (SkipEdge(0, 2, 24, (1,)),)
    assert lg.output_bytes_per_sample == (0, 24, 24, 8)
    assert not any(v.name.startswith("scale") for v in lg.values)
    x = torch.randn(5, 4)
    env = {"x": x}
    for i in range(lg.n_layers):
        env.update(lg.run_layer(i, env))
    assert torch.equal(env["output"], lg.module(x))


class _Shared(nn.Module):
    def __init__(self, share_weights: bool):
        super().__init__()
        self.fc1 = nn.Linear(4, 4)
        self.fc2 = nn.Linear(4, 4)
        self.pool = nn.Linear(4, 4) if share_weights else nn.ReLU()

    def forward(self, x):
        return self.pool(self.fc2(self.pool(self.fc1(x))))


def test_a_reused_parameter_free_module_gives_one_layer_per_run():
    lg = trace_layers(_Shared(False), torch.randn(2, 4))
    assert lg.names == ("fc1", "pool", "fc2", "pool@2")
    assert lg.modules == ("fc1", "pool", "fc2", "pool")


def test_a_module_with_weights_called_in_two_places_becomes_two_layers_sharing_them():
    lg = trace_layers(_Shared(True), torch.randn(2, 4))
    assert lg.names == ("fc1", "pool", "fc2", "pool@2")  # gradients summed across stages: tests/test_byom_shared.py


class _DataDependent(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        return self.fc(x) if x.sum() > 0 else x


def test_untraceable_forward_is_a_one_line_model_error():
    with pytest.raises(ModelSpecError, match="torch.fx cannot trace _DataDependent.forward") as e:
        trace_layers(_DataDependent(), torch.randn(2, 3))
    assert "\n" not in str(e.value)


def test_opaque_layers_trace_children_fx_cannot_enter():
    seq = nn.Sequential(OrderedDict(a=nn.Linear(3, 3), b=_DataDependent(), c=nn.Linear(3, 1)))
    lg = trace_layers(seq, torch.randn(2, 3), opaque=True)
    assert lg.names == ("a", "b", "c") and lg.fx_nodes[1] == ("b",)


def test_depth_two_splits_containers_and_glue_joins_the_running_block():
    class Stage(nn.Module):
        def __init__(self):
            super().__init__()
            self.b0 = nn.Linear(4, 4)
            self.b1 = nn.Linear(4, 4)

        def forward(self, x):
            y = self.b0(x)
            return self.b1(torch.relu(y)) + x  # relu and + are glue inside `Stage`

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.s0 = Stage()
            self.head = nn.Linear(4, 2)

        def forward(self, x):
            return self.head(self.s0(x))

    x = torch.randn(2, 4)
    assert trace_layers(Net(), x).names == ("s0", "head")
    lg = trace_layers(Net(), x, depth=2)
    assert lg.names == ("s0.b0", "s0.b1", "head")
    assert lg.fx_nodes[0] == ("x", "s0_b0", "relu") and lg.fx_nodes[1] == ("s0_b1", "add")
    assert lg.skip_edges == ()  # x is read by the add in b1's layer: the next layer, a chain edge
    assert lg.output_bytes_per_sample == (32, 16, 8)  # relu(y) and x, then s0's output, then head's
    assert lg.crossing_bytes().tolist() == [32, 16]


def test_bad_example_inputs_are_model_errors():
    model = build()
    with pytest.raises(ModelSpecError, match="first dimension is the batch"):
        trace_layers(model, torch.tensor(1.0))
    with pytest.raises(ModelSpecError, match="fails on the example input"):
        trace_layers(model, torch.randn(2, 5, 16, 16))
    with pytest.raises(ModelSpecError, match="takes 1 input"):
        trace_layers(model, (torch.randn(2, 3, 16, 16), torch.randn(2, 3)))
