"""`simulate` of one replica of a data x pipeline x tensor plan: on another hardware it re-prices
the memory limit and the pipeline links and refuses an MFU above 100% as `partition` does; its
gradient-sync and tensor-parallel figures are per device (an interleaved device's stages summed)
and are what the iteration is charged (a recomputed forward's collectives included)."""

from dataclasses import replace

import pytest

from planner.errors import PplanError
from planner.hardware import PRESETS
from planner.partition.parallel_plan import parallel_plan
from planner.partition.parallel_search import plan_parallel
from planner.plan import Links, write_plan
from planner.profiling.analytic import analytic_profile, write_analytic_profile
from planner.profiling.profile import load_profile
from planner.simulate import replica_on_hardware, simulate
from planner.whatif import WhatIf, what_if

GPT = "gpt:layers=8,hidden=1024,heads=16,seq=1024,vocab=32000"
A100 = PRESETS["a100-80gb"]


def _plan(prof, schedule: str, hardware=A100):
    result = plan_parallel(prof, hardware=hardware, nodes=2, global_batch=64, parallel="dp=2,pp=4,tp=2",
                           schedules=(schedule,), recompute="none")
    return parallel_plan(result, prof, hardware)


@pytest.fixture(scope="module")
def prof():
    return analytic_profile(GPT, "a100-80gb", "bfloat16", [1, 2, 4])


@pytest.fixture(scope="module")
def interleaved(prof):
    plan = _plan(prof, "interleaved")
    assert plan.virtual_stages > 1  # the case where per-stage and per-device figures differ
    return plan, simulate(plan, prof)


def test_another_hardware_prices_the_memory_limit_and_the_pipeline_links(prof):
    plan = _plan(prof, "1f1b")
    small = PRESETS["a100-40gb"]
    sim = simulate(plan, prof, hardware=small)
    assert set(sim.memory_limit_bytes) == {small.memory_bytes} != {A100.memory_bytes}
    assert sim.replica.hardware == "a100-40gb"
    # dp=2 x pp=4 x tp=2 on 2 nodes of 8 keeps each pipeline in one node: a slower NVLink is what
    # its transfers then cross (the plan's own links say the a100-80gb's)
    slow_link = replace(A100, name="a100-slow-link", intra_node_bandwidth_bytes_per_s=A100.intra_node_bandwidth_bytes_per_s / 10)
    moved = replica_on_hardware(plan, slow_link)
    assert moved.parallel.hardware == "a100-slow-link" and len(moved.links.pairs) == plan.n_devices - 1
    assert {bw for _, _, bw, _ in moved.links.pairs} == {slow_link.intra_node_bandwidth_bytes_per_s}
    assert {bw for _, _, bw, _ in plan.links.pairs} == {A100.intra_node_bandwidth_bytes_per_s}
    assert set(simulate(plan, prof, hardware=slow_link).memory_limit_bytes) == {A100.memory_bytes}


def test_the_plans_own_hardware_keeps_its_devices_and_links(prof):
    plan = _plan(prof, "1f1b")
    edited = plan.with_(links=Links(bandwidth_bytes_per_s=1e9, latency_ms=0.5,
                                    pairs=tuple((a, b, 1e9, 0.5) for a, b, _, _ in plan.links.pairs)))
    assert replica_on_hardware(edited, A100) is edited  # a hand edit or --bandwidth stands on the plan's own hardware
    assert simulate(edited, prof, hardware=A100).iteration_ms == simulate(edited, prof).iteration_ms
    assert simulate(edited, prof).iteration_ms > simulate(plan, prof).iteration_ms  # the edit is priced


def test_an_mfu_above_100_percent_is_refused_as_partition_refuses_it(prof):
    plan = _plan(prof, "1f1b")
    mfu = simulate(plan, prof).replica.mfu
    # a hardware whose peak the profile's times beat: the same hardware with its peak divided
    slow = replace(A100, name="a100-slow-peak", peak_bf16_flops_per_s=A100.peak_bf16_flops_per_s * mfu / 2)
    with pytest.raises(PplanError, match=r"predicted MFU 20\d(\.\d+)?% is above 100%.*peak of a100-slow-peak") as got:
        simulate(plan, prof, hardware=slow)
    with pytest.raises(PplanError, match="is above 100%") as searched:
        plan_parallel(prof, hardware=slow, nodes=2, global_batch=64, parallel="dp=2,pp=4,tp=2",
                      schedules=("1f1b",), recompute="none")
    assert got.value.hint == searched.value.hint  # one check, one message


def test_gradient_sync_is_per_device_and_never_below_its_exposed_part(interleaved):
    plan, sim = interleaved
    rep = sim.replica
    # the timeline's A row on a device spans the sync of all its stages, hidden part and exposed part
    spans = [r.end_ms - r.start_ms for r in sim.timeline if r.kind == "A"]
    assert len(spans) == plan.n_devices
    assert rep.grad_sync_ms == pytest.approx(max(spans), rel=1e-12)
    assert 0 < rep.grad_sync_exposed_ms <= rep.grad_sync_ms
    assert plan.predicted.grad_sync_ms == pytest.approx(rep.grad_sync_ms, rel=1e-12)  # what the plan records


def _t_rows_of_microbatch0(sim) -> list[float]:
    per_device = [0.0] * sim.n_devices
    for r in sim.timeline:
        if r.kind == "T" and r.microbatch == 0:
            per_device[r.device] += r.end_ms - r.start_ms
    return per_device


def test_tensor_parallel_collectives_are_per_device_per_microbatch(interleaved):
    plan, sim = interleaved
    # zero=0: every collective is a tensor-parallel all-reduce, drawn as T rows (forward and backward)
    assert sim.replica.tp_comm_ms == pytest.approx(max(_t_rows_of_microbatch0(sim)), rel=1e-9)
    assert plan.predicted.tp_comm_ms == pytest.approx(sim.replica.tp_comm_ms, rel=1e-12)


def test_a_recomputed_forward_adds_its_collectives_to_the_figure(prof):
    plan = _plan(prof, "1f1b")
    full = plan.with_(stages=tuple(replace(st, recompute=tuple(range(*st.layers))) for st in plan.stages))
    plain, recomputed = simulate(plan, prof), simulate(full, prof)
    # forward + input-gradient backward, plus the forward again: 3/2 of what runs without recompute
    assert recomputed.replica.tp_comm_ms == pytest.approx(1.5 * plain.replica.tp_comm_ms, rel=1e-12)
    assert plain.replica.tp_comm_ms > 0


def test_bandwidth_given_with_another_hardware_applies_over_its_links(tmp_path):
    """`simulate --hardware H --bandwidth B`: the links are H's first, then B replaces them (B was
    dropped when H's links were laid after the what-if)."""
    csv = tmp_path / "gpt.csv"
    write_analytic_profile(GPT, "a100-80gb", "bfloat16", [1, 2, 4], csv)
    write_plan(_plan(load_profile(csv), "1f1b"), tmp_path / "plan.json")
    slow = what_if(tmp_path / "plan.json", WhatIf(bandwidth_bytes_per_s=1e9), hardware="a100-40gb", profile=csv)
    plain = what_if(tmp_path / "plan.json", hardware="a100-40gb", profile=csv)
    assert {bw for _, _, bw, _ in slow.plan.links.pairs} == {1e9}
    assert slow.sim.iteration_ms > plain.sim.iteration_ms


def test_a_hardware_file_named_like_the_plans_preset_still_reprices(prof, tmp_path):
    """A copy of the a100-80gb preset with 20 GiB, keeping its name: the limit is the file's."""
    plan = _plan(prof, "1f1b")
    small = replace(A100, memory_bytes=20 * 2**30)
    assert small.name == plan.parallel.hardware
    assert set(replica_on_hardware(plan, small).devices[k].memory_bytes for k in range(plan.n_devices)) == {20 * 2**30}
    assert replica_on_hardware(plan, A100) is plan  # its own preset, every value alike
