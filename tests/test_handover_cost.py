"""A cross-rank hand-over costs both ranks CPU time where ranks fill the cores (planner.cost.handover_cpu_ms).

`pplan bench handover` measured it on the 2-core machine (0.5-1.4 ms a hand-over while both ranks
compute); `calibrate --machine` fits it per machine, the machine file carries it, and the
simulator charges it to the action that sends and to the one that receives.
"""

from __future__ import annotations

import numpy as np
import pytest

from planner.calibration import Calibration, load_calibration, write_calibration
from planner.cost import action_ms
from planner.cost.comm import handover_cpu_ms
from planner.errors import PplanError
from planner.machine import Machine, load_machine, machine_calibration, save_machine
from planner.partition.build import Layout, stage_costs
from planner.plan import Device, Links
from planner.profiling.profile import make_profile
from planner.schedules import generate
from planner.simulation.engine import simulate_costs

MIB = 2**20


def _two_stages(output_mib: float = 1.0):
    cols = {
        "fwd_ms": np.array([[2.0], [3.0]]), "bwd_ms": np.array([[4.0], [6.0]]),
        "param_bytes": np.array([[1e6], [1e6]]), "activation_bytes": np.array([[1e6], [1e6]]),
        "output_bytes": np.array([[output_mib * MIB], [1024.0]]),
    }
    costs = make_profile(["a", "b"], [1], cols, {}).at(1)
    devices = (Device("d0"), Device("d1"))
    layout = Layout(devices=devices, order=(0, 1), links=Links(bandwidth_bytes_per_s=1e12, latency_ms=0.0), virtual_stages=1)
    return costs, layout, stage_costs(costs, layout, (0, 1, 2), ((), ()), "adam")


def test_the_cost_is_an_intercept_plus_a_rate_per_mib():
    cal = Calibration(handover_cpu_ms=0.5, handover_cpu_ms_per_mib=0.25)
    assert handover_cpu_ms(2 * MIB, cal) == pytest.approx(1.0)
    assert handover_cpu_ms(2 * MIB, None) == 0.0 and handover_cpu_ms(0, cal) == 0.0
    assert handover_cpu_ms(2 * MIB, Calibration()) == 0.0


def test_the_simulator_charges_the_sending_and_the_receiving_action():
    _, layout, stages = _two_stages(output_mib=1.0)
    sched = generate("gpipe", 2, 4)
    base_cal = Calibration(action_overhead_ms=0.1)
    cal = Calibration(action_overhead_ms=0.1, handover_cpu_ms=0.5, handover_cpu_ms_per_mib=1.0)
    run = lambda c: simulate_costs(sched, stages, [0, 1], layout.devices, layout.links,  # noqa: E731
                                   micro_batch_size=1, calibration=c, record_timeline=True)
    base, charged = run(base_cal), run(cal)
    h = 0.5 + 1.0 * 1.0  # a 1 MiB activation, and its 1 MiB gradient back
    f0 = [r for r in charged.timeline if r.kind == "F" and r.stage == 0]
    assert all(r.end_ms - r.start_ms == pytest.approx(action_ms(stages[0].fwd_ms, cal) + h) for r in f0)
    # each rank sends 4 times (activations one way, gradients the other): its busy time grows by 4 h
    assert np.allclose(np.array(charged.busy_ms) - np.array(base.busy_ms), 4 * h)
    # the receiver's side is in its receive rows: the step takes longer than the senders' share alone
    assert charged.iteration_ms > base.iteration_ms + 4 * h


def test_machine_and_calibration_files_carry_it_and_bound_it(tmp_path):
    m = Machine(device_type="cpu", backend="gloo", ranks=2, threads=1, action_overhead_ms=0.2, comm_latency_ms=0.1,
                comm_bandwidth_bytes_per_s=4e9, step_overhead_ms=0.0, handover_cpu_ms=0.7, handover_cpu_ms_per_mib=0.4)
    assert load_machine(save_machine(m, tmp_path / "m.json")) == m
    cal = machine_calibration(m)
    assert (cal.handover_cpu_ms, cal.handover_cpu_ms_per_mib) == (0.7, 0.4)
    write_calibration(cal, tmp_path / "c.calibration.json")
    assert load_calibration(tmp_path / "c.calibration.json") == cal
    with pytest.raises(PplanError, match="handover_cpu_ms -1"):
        Calibration(handover_cpu_ms=-1.0)
    with pytest.raises(PplanError, match="handover_cpu_ms_per_mib"):
        Machine(**{**m.to_dict(), "handover_cpu_ms_per_mib": float("inf")})
    unmeasured = Machine(**{**m.to_dict(), "handover_cpu_ms": None, "handover_cpu_ms_per_mib": None})
    assert machine_calibration(unmeasured).handover_cpu_ms == 0.0


def test_the_1f1b_class_waits_for_its_sends_so_its_hand_overs_cost_no_compute():
    _, layout, stages = _two_stages(output_mib=1.0)
    cal = Calibration(handover_cpu_ms=0.5, handover_cpu_ms_per_mib=1.0)
    run = lambda name, c: simulate_costs(generate(name, 2, 4), stages, [0, 1], layout.devices, layout.links,  # noqa: E731
                                         micro_batch_size=1, calibration=c).iteration_ms
    assert run("1f1b", cal) == run("1f1b", Calibration())
    assert run("zb", cal) > run("zb", Calibration())

