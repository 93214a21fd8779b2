"""A non-chain model end to end: `module:factory` tracing, `pplan profile`, `partition`, `simulate`.

The U-Net of tests/unet_model.py becomes a GraphSequential whose children pass the tensors
crossing each cut; `pplan profile` writes its skip edges; `pplan partition` charges crossing
and pass-through bytes; the simulator's transfers carry `crossing_bytes` on every link, which
is also what torch's pipeline() sends between the stages split with split_policy (relays).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from planner.errors import ModelSpecError
from planner.graph import GraphSequential, SkipEdge, crossing_bytes
from planner.models import build_model
from planner.plan import load_plan
from planner.profiling.profile import load_profile, profile_to_text
from planner.profiling.profiler import profile_model
from planner.profiling.saved import tensor_bytes

from helpers.graphs import UNET_EDGES
from helpers.pipes import stage_sends

ROOT = Path(__file__).resolve().parents[1]
UNET = "tests.unet_model:build"


class Residual(nn.Module):
    """A top-level residual over three layers: the add after `c` reads the model input again."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c, self.head = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 2)

    def forward(self, x):
        h = self.c(torch.relu(self.b(torch.relu(self.a(x)))))
        return self.head(h + x)


def residual():
    """No make_batch: the input comes from --input-shape."""
    return Residual()


def _blocks() -> list[tuple[str, nn.Module]]:
    torch.manual_seed(0)
    return [("block0", nn.Sequential(nn.Linear(6, 16), nn.ReLU())), ("block1", nn.Sequential(nn.Linear(16, 16), nn.Tanh())),
            ("head", nn.Linear(16, 3))]


def _with_data(model: nn.Module) -> nn.Module:
    model.make_batch = lambda batch_size, seed: (torch.randn(batch_size, 6, generator=torch.Generator().manual_seed(seed)),
                                                 torch.randn(batch_size, 3, generator=torch.Generator().manual_seed(seed + 1)))
    model.loss_fn = torch.nn.functional.mse_loss
    return model


class Chain(nn.Module):
    """The layers of `chain_sequential`, called in order by a hand-written forward."""

    def __init__(self):
        super().__init__()
        for name, block in _blocks():
            self.add_module(name, block)

    def forward(self, x):
        return self.head(self.block1(self.block0(x)))


def chain_module():
    return _with_data(Chain())


def chain_sequential():
    from collections import OrderedDict

    return _with_data(nn.Sequential(OrderedDict(_blocks())))


def untraceable():
    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(3, 3)

        def forward(self, x):
            if x.sum() > 0:  # data-dependent: fx cannot trace it
                return self.a(x)
            return x

    return Branchy()


def test_factory_module_becomes_a_sequential_passing_the_crossing_tensors(monkeypatch):
    monkeypatch.chdir(ROOT)
    bundle = build_model(UNET)
    layers = bundle.layers
    assert isinstance(layers, GraphSequential) and len(layers) == 10
    lg = layers.graph
    assert lg.skip_edges == UNET_EDGES and bundle.input_bytes_per_sample == 3072
    assert layers.source not in list(layers.children())
    assert sum(p.numel() for p in layers.parameters()) == sum(p.numel() for p in layers.source.parameters())
    # Each layer's state dict has the user's model's own keys.
    keys = [k for child in layers for k in child.state_dict()]
    assert sorted(keys) == sorted(layers.source.state_dict())
    b = 3
    x, _ = bundle.make_batch(b, 1)
    cross = crossing_bytes(10, np.array(lg.output_bytes_per_sample) * b, lg.skip_edges, b)
    env = x
    for i, child in enumerate(layers):
        env = child(env)
        if i < 9:
            assert isinstance(env, dict) and tensor_bytes(env) == cross[i]
    assert torch.equal(env, layers.source(x)) and torch.equal(layers(x), env)
    with pytest.raises(ModelSpecError, match=r"layer 1 \(down1\).*got Tensor.*split_policy"):
        layers[1](x)


def test_the_single_process_reference_run_takes_the_graph_bundle(monkeypatch):
    from planner.execute.reference import reference_run
    from planner.plan import Device, Plan, StagePlan

    monkeypatch.chdir(ROOT)
    plan = Plan("gpipe", 2, 2, (StagePlan(0, (0, 3)), StagePlan(1, (3, 10))), (Device("a"), Device("b")), model=UNET, n_layers=10)
    losses, states = reference_run(plan, 2)
    assert len(losses) == 2 and all(np.isfinite(losses))
    assert sorted(k for i in range(10) for k in states[i]) == sorted(build_model(UNET).layers.source.state_dict())


def test_chain_models_stay_plain_sequentials():
    for spec in ("mlp:layers=2,hidden=8,input=4,classes=2", "factory_models:with_data"):
        layers = build_model(spec).layers
        assert type(layers) is nn.Sequential and getattr(layers, "graph", None) is None


def test_any_traceable_module_with_an_input_shape():
    bundle = build_model("test_graph_integration_model:residual", input_shape=(4,))
    lg = bundle.layers.graph
    assert lg.names == ("a", "b", "c", "head")
    assert lg.skip_edges == (SkipEdge(0, 2, 16),)  # x, read again by the add, which joins `c`
    x, y = bundle.make_batch(5, 0)
    out = bundle.layers(x)
    assert out.shape == y.shape and torch.equal(out, bundle.layers.source(x))
    assert float(bundle.loss_fn(out, y).detach()) >= 0


def test_untraceable_module_is_refused_on_one_line():
    with pytest.raises(ModelSpecError, match=r"model 'test_graph_integration_model:untraceable'.*torch.fx cannot trace Branchy.forward") as e:
        build_model("test_graph_integration_model:untraceable", input_shape=(3,))
    assert "\n" not in str(e.value)


def test_profiling_measures_each_traced_layer_and_writes_its_skip_edges(monkeypatch):
    monkeypatch.chdir(ROOT)
    prof = profile_model(UNET, [1, 2], warmup=0, repeats=1, seed=0)
    lg = build_model(UNET).layers.graph
    assert prof.names == lg.names and prof.skip_edges == lg.skip_edges == UNET_EDGES
    for k, b in enumerate(prof.micro_batch_sizes):
        assert list(prof.columns["output_bytes"][:, k]) == [b * x for x in lg.output_bytes_per_sample]
        assert np.all(prof.columns["activation_bytes"][:, k] > 0)
        fwd = prof.columns["fwd_ms"][:, k]  # measured: a tiny layer may read 0 on a loaded machine
        assert np.all(np.isfinite(fwd)) and np.all(fwd >= 0) and fwd.sum() > 0
    params = [sum(p.numel() * p.element_size() for p in lg.layer_module(i).parameters()) for i in range(10)]
    assert list(prof.columns["param_bytes"][:, 0]) == params
    assert sum(params) == sum(p.numel() * 4 for p in lg.module.parameters())
    assert prof.input_bytes_per_sample == 3072
    assert profile_to_text(prof).count("# edge: ") == 2
    # Bytes are those of the profiled dtype.
    half = profile_model(UNET, [2], warmup=0, repeats=1, dtype="bfloat16")
    assert half.skip_edges == tuple(e._replace(bytes_per_sample=e.bytes_per_sample // 2) for e in UNET_EDGES)


def test_a_chain_written_as_a_module_profiles_like_the_sequential():
    traced = profile_model("test_graph_integration_model:chain_module", [1, 2], warmup=0, repeats=1)
    plain = profile_model("test_graph_integration_model:chain_sequential", [1, 2], warmup=0, repeats=1)
    assert traced.skip_edges == () and traced.names == plain.names == ("block0", "block1", "head")
    for c in ("param_bytes", "activation_bytes", "shared_input_bytes", "output_bytes", "flops"):
        assert np.array_equal(traced.columns[c], plain.columns[c]), c
    assert traced.input_bytes_per_sample == plain.input_bytes_per_sample == 24
    assert "# edge" not in profile_to_text(traced)


def _timeline_link_bytes(path: Path, bandwidth: float, latency_ms: float) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            # a receiver's C row holds a transfer's bytes part, the sender's one the latency only;
            # on a chain each device receives the bytes it sends (its input's gradient, its output)
            ms = float(row["end_ms"]) - float(row["start_ms"])
            if row["kind"] == "C" and abs(ms - latency_ms) > 1e-6:
                out.setdefault(int(row["device"]), []).append(round(ms * bandwidth / 1e3))
    return {d: sorted(v) for d, v in out.items()}


def _pipeline_sends(model: nn.Module, lg, cuts: list[int], mb: torch.Tensor) -> np.ndarray:
    """Bytes each stage sends the next per micro-batch in torch's pipeline() with split_policy."""
    from torch.distributed.pipelining import pipeline

    from planner.graph import split_policy

    return stage_sends(pipeline(model, (mb,), split_policy=split_policy(lg, cuts)), mb)


def test_profile_partition_simulate_a_unet_end_to_end(pplan, monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)  # `tests.unet_model` is found from the repository root
    prof_csv, plan_json, timeline = tmp_path / "unet.csv", tmp_path / "plan.json", tmp_path / "timeline.csv"
    code, out, err = pplan("profile", "--model", UNET, "-b", "2,4", "--warmup", "0", "--repeats", "1", "-o", prof_csv)
    assert code == 0, err
    text = prof_csv.read_text()
    assert "# edge: 0->1,7 4096\n# edge: 2->3,5 2048\n" in text
    prof = load_profile(prof_csv)
    assert prof.skip_edges == UNET_EDGES
    # Slow links make the transfers long enough to read their bytes back from the timeline CSV.
    code, out, err = pplan("partition", prof_csv, "--devices", "3", "--global-batch", "16",
                           "--microbatches", "4", "--schedule", "1f1b", "--bandwidth", "10MB/s", "--latency", "0.5ms", "--out", plan_json)
    assert code == 0, err
    plan = load_plan(plan_json)
    b, M = plan.micro_batch_size, plan.n_microbatches
    cuts = [st.layers[1] - 1 for st in plan.stages[:-1]]
    cross = crossing_bytes(10, prof.at(b).output_bytes, prof.skip_edges, b)
    # The plan's memory: torch's stage keeps a receive buffer per micro-batch for the crossing bytes
    # at each of its cuts (activations in, gradients of its output); the first holds the input batch
    # and the last the step's targets.
    batch, target = prof.at(b).input_bytes, prof.at(b).target_bytes
    assert target > 0
    for d, dev in enumerate(plan.predicted.devices):
        ends = [c for c in (cuts[d - 1] if d else None, cuts[d] if d < len(cuts) else None) if c is not None]
        held = (batch if d == 0 else 0.0) + (target if d == len(plan.predicted.devices) - 1 else 0.0)
        assert dev.memory.buffers == int(M * (sum(cross[c] for c in ends) + held))
    code, out, err = pplan("simulate", plan_json, "--timeline", timeline, "--json")
    assert code == 0, err
    assert json.loads(out)["iteration_ms"] == pytest.approx(plan.predicted.iteration_ms)
    sent = _timeline_link_bytes(timeline, 10e6, 0.5)
    want = {0: [cross[cuts[0]]] * M, 1: sorted([cross[cuts[0]]] * M + [cross[cuts[1]]] * M), 2: [cross[cuts[1]]] * M}
    assert sent == {d: [int(x) for x in v] for d, v in want.items()}
    # torch's pipeline(), split at the plan's cuts with relays, sends exactly these bytes forward.
    bundle = build_model(UNET)
    x, _ = bundle.make_batch(b, 0)
    sends = _pipeline_sends(bundle.layers.source, bundle.layers.graph, cuts, x)
    assert np.array_equal(sends, np.diag(cross[cuts], k=1))
