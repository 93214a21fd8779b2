"""When a split backward frees the stage output torch holds: one rule for partitioner and simulator.

torch 2.13's PipelineStage pops a micro-batch's output from fwd_cache at its I and keeps, for W,
the stage output in backward_state on every stage but the last, where it keeps the loss instead
(planner.cost.pending_output). The partitioner (DP, ILP, brute force, stage_peak_bytes) and the
simulator (memory_peaks and the memory timeline) price zero-bubble plans with that rule, so they
charge the same peak, whatever the profile measured of wgrad_bytes.
"""

import dataclasses

import numpy as np
import pytest

from planner.cost import stage_peak_bytes
from planner.cost.held import pending_output, sent_bytes
from planner.partition import PartitionSettings
from planner.partition.build import Layout, stage_costs
from planner.partition.problem import stage_bytes
from planner.partition.search import CandidateEvaluator, GridPoint
from planner.plan import Device, Links
from planner.profiling.profile import make_profile
from planner.schedules import generate
from planner.schedules.memory import stage_inflight_peak, stage_memory_moments
from planner.simulate import simulate_costs

from helpers.memory import solvers_agree
from helpers.profiles import SIZES, random_profile

REL = 1e-12


def test_the_last_stage_frees_its_output_at_input_grad_the_others_at_weight_grad():
    assert pending_output(100.0, False) == 100.0 and pending_output(100.0, True) == 0.0
    got = pending_output(np.array([5.0, 6.0, 7.0]), np.array([False, False, True]))
    assert got.tolist() == [5.0, 6.0, 0.0]
    # the sends' terms need the wgrad column (older profiles' plans keep them out); the rule does not
    assert sent_bytes(1.0, 2.0, 3.0, False) == (0.0, 0.0, 3.0)
    assert sent_bytes(1.0, 2.0, 3.0, True) == (1.0, 2.0, 3.0)
    assert sent_bytes(1.0, 0.0, 3.0, True, is_last=True) == (1.0, 0.0, 0.0)


def _profile(rng, n_layers: int, wgrad: bool):
    """A random profile whose layers save none, half or all of their output (the rest is the held
    output), with or without a wgrad_bytes column."""
    base = random_profile(rng, n_layers)
    cols = {k: base.columns[k] for k in ("fwd_ms", "bwd_ms", "param_bytes", "activation_bytes", "output_bytes")}
    cols["output_saved_bytes"] = np.round(cols["output_bytes"] * rng.choice([0.0, 0.5, 1.0], (n_layers, 1)))
    if wgrad:
        cols["wgrad_bytes"] = np.round(cols["activation_bytes"] * rng.uniform(0, 1, (n_layers, 1)))
    return make_profile(list(base.names), SIZES, cols, dict(base.meta))


def _charged_and_simulated(prof, n: int, m: int, b: int, cuts, rec):
    devices = tuple(Device(f"d{i}") for i in range(n))
    layout = Layout(devices, tuple(range(n)), Links(bandwidth_bytes_per_s=1e9, latency_ms=0.02))
    settings = PartitionSettings(n_devices=n, memory_bytes=None, global_batch=b * m)
    problem = CandidateEvaluator(prof, settings, None).problem(GridPoint("zb", m, b, 1), layout)
    sched = generate("zb", n, m)
    stages = stage_costs(prof.at(b), layout, cuts, rec, "adam", n_microbatches=m)
    sim = simulate_costs(sched, stages, list(range(n)), devices, layout.links, micro_batch_size=b, record_timeline=True)
    kinds, peak = stage_memory_moments(sched), stage_inflight_peak(sched)
    charged = [stage_bytes(problem, s, cuts[s], cuts[s + 1], rec[s]) for s in range(n)]
    direct = [stage_peak_bytes(stages[s], peak[s], kinds[s]) for s in range(n)]
    return sim, charged, direct, stages


@pytest.mark.parametrize("wgrad", [False, True])
def test_partitioner_charges_the_simulators_zero_bubble_peak(wgrad):
    rng = np.random.default_rng(7 if wgrad else 8)
    pending_mattered = sends_peak = 0
    for _ in range(40):
        prof = _profile(rng, int(rng.integers(2, 8)), wgrad)
        L = prof.n_layers
        n = int(rng.integers(2, min(L, 4) + 1))
        cuts = (0, *sorted(int(x) for x in rng.choice(np.arange(1, L), n - 1, replace=False)), L)
        rec = tuple(tuple(x for x in range(cuts[s], cuts[s + 1]) if rng.random() < 0.3) for s in range(n))
        m, b = n * int(rng.integers(1, 4)), int(rng.choice(SIZES))  # torch runs zb with multiples of P
        sim, charged, direct, stages = _charged_and_simulated(prof, n, m, b, cuts, rec)
        for s in range(n):
            assert charged[s] == pytest.approx(sim.peak_memory_bytes[s], rel=REL), (s, n, m, cuts, rec)
            assert direct[s] == pytest.approx(charged[s], rel=REL)
            # the memory timeline walks the same rule to the same peak, the state after a rank's last
            # W included (its sends hold every output and input gradient until the step waits)
            assert max(v for _, v in sim.memory_timeline[s]) == pytest.approx(sim.peak_memory_bytes[s], rel=REL)
            mem, st = sim.memory[s], stages[s]
            after_last = mem.weights + mem.optimizer + mem.buffers + st.param_bytes + m * (st.sent_grad_bytes + st.sent_output_bytes)
            sends_peak += st.sent_output_bytes > 0 and after_last == pytest.approx(sim.peak_memory_bytes[s], rel=REL)
        last = stages[-1]
        assert last.sent_held_bytes == 0.0 and all(st.sent_held_bytes == st.held_output_bytes for st in stages[:-1])
        # held until W on the last stage too would charge more there: the rule is what made them equal
        if last.held_output_bytes > 0:
            until_w = dataclasses.replace(last, sent_held_bytes=last.held_output_bytes)
            kinds = stage_memory_moments(generate("zb", n, m))[-1]
            pending_mattered += stage_peak_bytes(until_w, 0, kinds) > direct[-1]
    assert pending_mattered > 3
    assert sends_peak > 0 or not wgrad  # the state after the last action was some rank's peak


def _with_held_output(rng, p):
    """A random problem as zero bubble prices it: moments with pending W (at most the micro-batches
    held, every pending W's I ended), wgrad bytes, and a held output per layer."""
    def split(m):
        pending = int(rng.integers(0, int(m.in_flight) + 1))
        return dataclasses.replace(m, pending_w=pending, sent_grads=pending + int(rng.integers(0, 3)),
                                   running_i=bool(m.transient and pending < m.in_flight and rng.random() < 0.5))
    moments = tuple(tuple(split(m) for m in kinds) for kinds in p.moments)
    held = np.floor(p.activation_bytes * rng.uniform(0, 1, p.n_layers))
    wgrad = np.floor(p.activation_bytes * rng.uniform(0, 1, p.n_layers)) if rng.random() < 0.5 else None
    return dataclasses.replace(p, moments=moments, held_output_bytes=held, wgrad_bytes=wgrad)


def _with_moments(rng, p):
    from planner.schedules.memory import Moment

    kinds = tuple((Moment(float(k), True, False), Moment(float(max(k - 1, 1)), False, True)) for k in p.inflight)
    return dataclasses.replace(p, moments=kinds, gradient_bytes=np.floor(p.static_bytes * rng.uniform(0, 1, p.n_layers)))


def test_dp_ilp_and_brute_force_agree_on_the_held_output_rule():
    feasible, differs = solvers_agree(np.random.default_rng(4242), 500, lambda rng, p: _with_held_output(rng, _with_moments(rng, p)),
                                      30, lambda p: dataclasses.replace(p, held_output_bytes=None), stage_bytes_rel=REL)
    assert 100 < feasible < 500
    assert differs > 10  # the held output changed the optimum
