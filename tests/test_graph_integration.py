"""Non-chain models in the profile, the cost model, the partitioner and the simulator (no torch).

Skip edges written as `# edge:` lines reach LayerCosts; planner.cost charges a stage the
crossing bytes at its cuts, the pass-through tensors it only forwards, and a checkpoint
everything its layer reads; the partition problem carries the same numbers, DP = ILP = brute
force on it, and the simulator moves the crossing bytes over every link. A chain's profile
text and every number computed from it are what they were.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from planner.cost import stage_cost
from planner.errors import ProfileError
from planner.graph import SkipEdge, crossing_bytes
from planner.partition import PartitionSettings, partition
from planner.partition.brute import solve_brute
from planner.partition.build import Layout, build_problem
from planner.partition.dp import min_memory_scale, solve_dp
from planner.partition.ilp import solve_ilp
from planner.partition.problem import PartitionProblem, passthrough_table, stage_bytes, stage_passthrough
from planner.plan import Device, Links, Plan, StagePlan
from planner.profiling.csvio import OPTIONAL_COLUMNS
from planner.profiling.profile import load_profile, make_profile, profile_to_text, read_profile_text
from planner.simulate import simulate

from helpers.figures import layer_graph_counts
from helpers.graphs import UNET_EDGES, UNET_NAMES, UNET_OUTPUT_BYTES
from helpers.oracles import brute_min_scale, dp_plan_fits_the_simulator
from helpers.problems import MODES, objective, random_problem
from helpers.profiles import SIZES, random_edges, random_profile

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = sorted((ROOT / "profiles").glob("*.csv"))
UNET_CHAIN = np.array(UNET_OUTPUT_BYTES, dtype=float)


def unet_profile(edges=UNET_EDGES):
    """A profile with the U-Net's bytes (times and activations made up, per sample x b)."""
    b = np.array(SIZES, dtype=float)[None, :]
    fwd = np.array([4, 1, 4, 1, 5, 2, 4, 2, 4, 1], dtype=float)[:, None] * b / 4
    cols = {
        "fwd_ms": fwd, "bwd_ms": 2 * fwd,
        "param_bytes": np.repeat(np.array([1104, 0, 3648, 0, 14208, 2080, 7040, 528, 1808, 40.0])[:, None], 3, axis=1),
        "activation_bytes": np.array([19472, 6144, 9232, 3072, 4624, 1024, 12304, 2048, 24592, 8192.0])[:, None] * b,
        "output_bytes": UNET_CHAIN[:, None] * b,
    }
    return make_profile(list(UNET_NAMES), SIZES, cols, {"model": "tests.unet_model:build", "input_bytes_per_sample": "3072"}, skip_edges=edges)


# --- profile format -------------------------------------------------------------------------

@pytest.mark.parametrize("path", REFERENCE, ids=lambda p: p.name)
def test_reference_chain_profiles_are_rewritten_byte_for_byte(path):
    prof = load_profile(path)
    assert prof.skip_edges == () and "edge" not in prof.meta
    assert profile_to_text(prof) == path.read_text(encoding="utf-8")
    costs = prof.at(prof.micro_batch_sizes[-1])
    assert costs.skip_edges == () and costs.crossing_bytes is None and costs.layer_input_bytes is None


def test_edge_lines_round_trip_after_the_metadata():
    prof = unet_profile()
    text = profile_to_text(prof)
    lines = text.splitlines()
    header = lines.index(next(ln for ln in lines if not ln.startswith("#")))
    assert lines[header - 2:header] == ["# edge: 0->1,7 4096", "# edge: 2->3,5 2048"]
    again = read_profile_text(text)
    assert again.skip_edges == UNET_EDGES and "edge" not in again.meta
    assert profile_to_text(again) == text
    chain = unet_profile(edges=())
    assert "# edge" not in profile_to_text(chain) and chain.skip_edges == ()


def test_a_bad_edge_line_names_the_file_and_line():
    text = profile_to_text(unet_profile()).replace("# edge: 2->3,5 2048", "# edge: 2->3,12 2048")
    with pytest.raises(ProfileError, match=r"unet\.csv:\d+: edge '2->3,12 2048'.*out of range"):
        read_profile_text(text, source="unet.csv")
    huge = profile_to_text(unet_profile()).replace("# edge: 2->3,5 2048", "# edge: 2->3,5 1" + "0" * 20)
    with pytest.raises(ProfileError, match=r"unet\.csv:\d+: edge '2->3,5 1(0{20})': 1\1 bytes per sample is too large"):
        read_profile_text(huge, source="unet.csv")


# --- cost model -------------------------------------------------------------------------------

def _oracle(costs, edges, n):
    """Per-tensor definitions: (crossing per cut, pass-through per stage, layer input bytes)."""
    b = costs.micro_batch_size
    tensors = [(p, (p + 1,), float(costs.output_bytes[p])) for p in range(n - 1)]
    tensors += [(e.src, e.consumers, float(e.bytes_per_sample * b)) for e in edges]
    cross = [sum(x for p, r, x in tensors if p <= c < max(r)) for c in range(n - 1)]

    def through(first, end):
        return sum(x for p, r, x in tensors if p < first and max(r) >= end and not any(first <= c < end for c in r))

    inputs = [float(costs.input_bytes)] + [sum(x for p, r, x in tensors if layer in r) for layer in range(1, n)]
    return cross, through, inputs


def test_stage_cost_charges_crossing_passthrough_and_checkpoint_inputs():
    rng = np.random.default_rng(8)
    checked = 0
    for _ in range(40):
        n = int(rng.integers(3, 9))
        prof = random_profile(rng, n, skip_edges=True)
        if not prof.skip_edges:
            continue
        b = int(rng.choice([1, 2, 3, 4, 8]))  # 3 and 8 are interpolated
        costs = prof.at(b)
        cross, through, inputs = _oracle(costs, prof.skip_edges, n)
        assert np.allclose(costs.crossing_bytes, cross, rtol=1e-12) and np.allclose(costs.layer_input_bytes, inputs, rtol=1e-12)
        for first, end in itertools.combinations(range(n + 1), 2):
            rec = tuple(range(first, end, 2))
            st = stage_cost(costs, first, end, rec)
            assert st.input_bytes == (cross[first - 1] if first else 0.0)
            assert st.output_bytes == (cross[end - 1] if end < n else 0.0)
            kept = sum(inputs[i] if i in rec else costs.activation_bytes[i] for i in range(first, end)) + through(first, end)
            assert st.kept_bytes == pytest.approx(kept, rel=1e-12)
            checked += through(first, end) > 0
    assert checked > 20  # pass-through stages were exercised


def test_unet_stage_numbers():
    costs = unet_profile().at(2)
    assert list(costs.crossing_bytes) == [2 * x for x in (4096, 5120, 6144, 6656, 7168, 8192, 6144, 8192, 4096)]
    mid = stage_cost(costs, 3, 5)  # e1 passes through (read at 1 and 7); e2 is read here by down2
    assert (mid.input_bytes, mid.output_bytes) == (2 * 6144, 2 * 7168)
    assert mid.kept_bytes == costs.activation_bytes[3] + costs.activation_bytes[4] + 2 * 4096
    up1 = stage_cost(costs, 7, 10, recompute=(7,))  # a checkpoint of up1 keeps d2 and e1
    assert up1.kept_bytes == 2 * (2048 + 4096) + costs.activation_bytes[8] + costs.activation_bytes[9]


def test_zero_byte_edges_give_exactly_the_chain_numbers():
    for path in REFERENCE:
        chain = load_profile(path)
        n = chain.n_layers
        if n < 3:
            continue
        edges = [SkipEdge(0, n - 1, 0, (1,)), SkipEdge(n - 3, n - 1, 0)]
        columns = {k: v for k, v in chain.columns.items() if k in chain.present or k not in OPTIONAL_COLUMNS}
        graph = make_profile(list(chain.names), list(chain.micro_batch_sizes), columns, dict(chain.meta), skip_edges=edges)
        for b in (chain.micro_batch_sizes[0], 3):
            a, g = chain.at(b), graph.at(b)
            for first, end in itertools.combinations(range(n + 1), 2):
                rec = tuple(range(first, end, 3))
                assert stage_cost(a, first, end, rec) == stage_cost(g, first, end, rec)


# --- partition problem and solvers ------------------------------------------------------------

def _layout(n: int, memory=None, bandwidth=1e9) -> Layout:
    return Layout(tuple(Device(f"d{i}", memory) for i in range(n)), tuple(range(n)), Links(bandwidth_bytes_per_s=bandwidth, latency_ms=0.01))


def test_problem_carries_the_cost_models_bytes():
    prof = unet_profile()
    costs = prof.at(4)
    p = build_problem(costs, _layout(3), [3, 2, 1], optimizer="adam", recompute="auto")
    assert list(p.boundary_bytes) == [0.0, *costs.crossing_bytes, 0.0]
    assert list(p.input_bytes) == list(costs.layer_input_bytes)
    for first, end in itertools.combinations(range(11), 2):
        for s, rec in ((0, ()), (1, tuple(range(first, end)))):
            st = stage_cost(costs, first, end, rec)
            want = st.static_bytes + st.buffer_bytes + p.inflight[s] * st.kept_bytes + st.transient_bytes
            assert stage_bytes(p, s, first, end, rec) == pytest.approx(want, rel=1e-12)
    chain = build_problem(unet_profile(edges=()).at(4), _layout(3), [3, 2, 1], optimizer="adam", recompute="auto")
    assert chain.passthrough_edges == () and passthrough_table(chain) is None


def _with_edges(p: PartitionProblem, edges) -> PartitionProblem:
    return PartitionProblem(**{**p.__dict__, "passthrough_edges": edges})


def test_passthrough_table_matches_the_definition():
    rng = np.random.default_rng(3)
    for _ in range(200):
        p = random_problem(rng, "none", max_layers=9)
        p = _with_edges(p, random_edges(rng, p.n_layers))
        table = passthrough_table(p)
        if table is None:
            continue
        for i, j in itertools.combinations(range(p.n_layers + 1), 2):
            assert table[i, j] == stage_passthrough(p, i, j)


def test_dp_ilp_and_brute_force_agree_on_random_non_chain_instances():
    rng = np.random.default_rng(77)
    changed = feasible = 0
    for case in range(600):
        base = random_problem(rng, MODES[case % 3])
        p = _with_edges(base, random_edges(rng, base.n_layers, scale=3, max_edges=4))
        dp, brute = solve_dp(p), solve_brute(p)
        assert objective(dp) == objective(brute), (case, p)
        if case % 6 == 0:
            ilp = solve_ilp(p, time_limit=20)
            assert objective(ilp) == objective(dp), (case, p)
            assert ilp is None or ilp.optimal
        feasible += dp is not None
        changed += objective(dp) != objective(solve_dp(base))
    assert changed > 20 and 150 < feasible < 600  # pass-through memory decided tens of instances


def test_min_memory_scale_counts_passthrough():
    rng = np.random.default_rng(11)
    for case in range(150):
        base = random_problem(rng, MODES[case % 3])
        p = _with_edges(base, random_edges(rng, base.n_layers))
        assert min_memory_scale(p)[0] == pytest.approx(brute_min_scale(p), rel=1e-12, abs=1e-12)


def _two_cut_profile(with_edge: bool):
    """Five layers; a cut after layer 1 or after layer 2 balances compute equally (layer 2 is free).

    The chain bytes make the cut after layer 1 look cheaper (1000 < 1100 B per sample), but a
    1 MB skip tensor from layer 0 to layer 2 crosses it: hop by hop it is the dear one.
    """
    b = np.array(SIZES, dtype=float)[None, :]
    fwd = np.array([1.0, 1.0, 0.0, 1.0, 1.0])[:, None] * b
    cols = {"fwd_ms": fwd, "bwd_ms": 2 * fwd, "param_bytes": np.full((5, 3), 1e6),
            "activation_bytes": np.full((5, 1), 1e4) * b, "output_bytes": np.array([0, 1000, 1100, 1000, 10.0])[:, None] * b}
    edges = [SkipEdge(0, 2, 1_000_000)] if with_edge else []
    return make_profile([f"l{i}" for i in range(5)], SIZES, cols, {"input_bytes_per_sample": "100"}, skip_edges=edges)


@pytest.mark.parametrize("method", ["dp", "ilp", "auto"])
def test_planner_takes_the_cheaper_of_two_equally_balanced_cuts(method):
    settings = PartitionSettings(n_devices=2, memory_bytes=None, global_batch=8, microbatches=2, schedule="gpipe",
                                 method=method, bandwidth=1e9)
    graph = partition(_two_cut_profile(True), settings).plan
    assert [st.layers for st in graph.stages] == [(0, 3), (3, 5)]
    # Without the edge lines the same numbers make the other cut the cheaper one.
    chain = partition(_two_cut_profile(False), settings).plan
    assert [st.layers for st in chain.stages] == [(0, 2), (2, 5)]


def test_dp_feasible_plans_fit_in_the_simulator_on_random_non_chain_profiles():
    rng = np.random.default_rng(4048)
    checked = through = 0
    for case in range(70):
        found = dp_plan_fits_the_simulator(rng, case, random_profile(rng, int(rng.integers(3, 11)), skip_edges=True))
        if found is None:
            continue
        problem, sol = found
        checked += 1
        through += any(stage_passthrough(problem, i, j) > 0 for i, j in zip(sol.cuts, sol.cuts[1:]))
    assert checked >= 25 and through >= 5


# --- simulator --------------------------------------------------------------------------------

def _link_bytes(sim, plan: Plan) -> dict[int, list[float]]:
    """Receiving device -> bytes of every transfer it took, read back from the receivers' C rows
    (a transfer's bytes part; the C row under its sender lasts the link's latency only). On a
    chain each device receives the same bytes it sends: its input back as a gradient, its output."""
    out: dict[int, list[float]] = {}
    for row in sim.timeline:
        if row.kind == "C":
            bw, lat = plan.links.between(row.device, row.device + 1)
            if abs(row.end_ms - row.start_ms - lat) > 1e-9:
                out.setdefault(row.device, []).append(round((row.end_ms - row.start_ms) * bw / 1e3))
    return {d: sorted(v) for d, v in out.items()}


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "zb"])
def test_simulated_transfers_carry_the_crossing_bytes_on_every_link(schedule):
    prof = unet_profile()
    b, M = 2, 4
    plan = Plan(schedule, b, M, (StagePlan(0, (0, 3)), StagePlan(1, (3, 5)), StagePlan(2, (5, 10))),
                tuple(Device(f"d{i}") for i in range(3)), links=Links(bandwidth_bytes_per_s=1e8, latency_ms=0.5), n_layers=10)
    sim = simulate(plan, prof)
    cross = crossing_bytes(10, UNET_CHAIN * b, UNET_EDGES, b)
    c0, c1 = float(cross[2]), float(cross[4])  # cuts after layers 2 and 4
    assert (c0, c1) == (2 * 6144, 2 * 7168)
    # forward: each cut's crossing once per micro-batch; backward: its gradient, the same bytes back
    assert _link_bytes(sim, plan) == {0: [c0] * M, 1: sorted([c1] * M + [c0] * M), 2: [c1] * M}
    # memory: the middle stage holds e1 (passing through) per micro-batch in flight, buffers both cuts
    costs = prof.at(b)
    kept = costs.activation_bytes[3] + costs.activation_bytes[4] + 4096 * b
    assert sim.memory[1].buffers == 2 * (c0 + c1)
    if schedule == "gpipe":
        assert sim.memory[1].activations == M * kept


def test_partition_plot_draws_the_plans_cuts_from_its_profile(tmp_path, pplan):
    from planner.plan import load_plan
    from planner.profiling.profile import write_profile

    write_profile(unet_profile(), tmp_path / "unet.csv")
    code, _, err = pplan("partition", tmp_path / "unet.csv", "--devices", 3, "--global-batch", 8, "--microbatches", 4,
                         "--schedule", "gpipe", "--method", "dp", "--out", tmp_path / "plan.json", "--plot", tmp_path / "g.png")
    assert code == 0, err
    plan = load_plan(tmp_path / "plan.json")
    assert len(plan.stages) == 3
    assert layer_graph_counts(tmp_path / "g.png") == (plan.n_layers, 2, True)  # drawn: every layer, both cuts, the skips
