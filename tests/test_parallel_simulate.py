"""Simulating one replica of a data x pipeline x tensor plan: the gradient sync and the
tensor-parallel collectives on the timeline, closed forms of the overlap, and `simulate(plan)`
giving what the 3-D search recorded."""

import json
from dataclasses import replace

import pytest

from planner.cost import StageCost
from planner.errors import PlanError
from planner.parallel import ParallelConfig
from planner.partition.parallel_plan import parallel_plan
from planner.partition.parallel_search import plan_parallel
from planner.plan import Device, Links, load_plan, plan_from_dict, plan_to_json
from planner.profiling.analytic import analytic_profile
from planner.schedules import generate
from planner.simulate import simulate, simulate_costs

GPT = "gpt:layers=8,hidden=1024,heads=16,seq=1024,vocab=32000"


def _stage(fwd=1.0, bwd=4.0, sync=0.0, comm=0.0, opt=0.5) -> StageCost:
    return StageCost(first=0, end=1, recompute=(), fwd_ms=fwd, bwd_ms=bwd, bwd_input_ms=bwd / 2, bwd_weight_ms=bwd / 2,
                     recompute_ms=0.0, optimizer_ms=opt, param_bytes=1e6, static_bytes=4e6, kept_bytes=1e3,
                     transient_bytes=0.0, input_bytes=0.0, output_bytes=0.0, comm_fwd_ms=comm, comm_bwd_ms=comm,
                     grad_sync_ms=sync)


def _one_stage(stage: StageCost, overlap: bool = True):
    return simulate_costs(generate("gpipe", 1, 1), [stage], [0], [Device("gpu")], Links(), micro_batch_size=1,
                          record_timeline=True, overlap_grad_sync=overlap)


@pytest.mark.parametrize("sync,overlap,exposed", [(10.0, True, 6.0), (10.0, False, 10.0), (3.0, True, 0.0), (0.0, True, 0.0)])
def test_gradient_sync_hides_behind_the_last_backward_only(sync, overlap, exposed):
    # F 1 ms, B 4 ms, optimizer 0.5 ms: the sync may overlap the 4 ms backward and nothing else
    sim = _one_stage(_stage(sync=sync), overlap)
    assert sim.iteration_ms == pytest.approx(1.0 + 4.0 + exposed + 0.5, rel=1e-12)
    rows = {r.kind: r for r in sim.timeline}
    assert rows["O"].start_ms == pytest.approx(5.0 + exposed)
    if sync:
        assert rows["A"].end_ms - rows["A"].start_ms == pytest.approx(sync)
        assert rows["A"].end_ms == pytest.approx(rows["O"].start_ms)
    else:
        assert "A" not in rows


def test_under_a_split_backward_the_sync_hides_behind_the_last_w_only():
    # 2 ranks, zb, M=4, F = I = W = 1 ms, sync 2 ms: the weight gradients exist only once the
    # last W runs, so 1 ms of the sync is hidden (W's length) and 1 ms delays the step; under
    # 1f1b the same 2 ms hide behind the 2 ms B
    def run(name: str):
        stages = [replace(_stage(bwd=2.0, sync=2.0, opt=0.0), first=s, end=s + 1) for s in range(2)]
        return simulate_costs(generate(name, 2, 4), stages, [0, 1], [Device("a"), Device("b")], Links(latency_ms=0.0),
                              micro_batch_size=1, record_timeline=True, overlap_grad_sync=True)

    zb = run("zb")
    for d in (0, 1):
        last_w = max((r for r in zb.timeline if r.device == d and r.kind == "W"), key=lambda r: r.end_ms)
        sync_row = next(r for r in zb.timeline if r.device == d and r.kind == "A")
        assert sync_row.start_ms == pytest.approx(last_w.start_ms)
        assert sync_row.end_ms == pytest.approx(last_w.end_ms + 1.0)
    no_sync = simulate_costs(generate("zb", 2, 4), [replace(_stage(bwd=2.0, opt=0.0), first=s, end=s + 1) for s in range(2)],
                             [0, 1], [Device("a"), Device("b")], Links(latency_ms=0.0), micro_batch_size=1)
    assert zb.iteration_ms == pytest.approx(no_sync.iteration_ms + 1.0)
    f1b = run("1f1b")
    assert next(r for r in f1b.timeline if r.device == 0 and r.kind == "A").end_ms == pytest.approx(
        max(r.end_ms for r in f1b.timeline if r.device == 0 and r.kind == "B"))


def test_collectives_are_drawn_at_the_end_of_their_box_and_change_no_time():
    plain, with_comm = _one_stage(_stage()), _one_stage(_stage(comm=0.3))
    assert with_comm.iteration_ms == plain.iteration_ms  # part of fwd/bwd already: drawing only
    t_rows = [r for r in with_comm.timeline if r.kind == "T"]
    f = next(r for r in with_comm.timeline if r.kind == "F")
    assert len(t_rows) == 2 and t_rows[0].start_ms == pytest.approx(f.end_ms)
    assert all(r.end_ms - r.start_ms == pytest.approx(0.3) for r in t_rows)


@pytest.fixture(scope="module")
def searched():
    prof = analytic_profile(GPT, "a100-80gb", "bfloat16", [1, 2, 4])
    result = plan_parallel(prof, hardware="a100-80gb", nodes=2, global_batch=64, parallel="dp=2,pp=4,tp=2", zero=1)
    return prof, result


def test_simulating_the_plan_gives_what_the_search_recorded(searched, tmp_path):
    prof, result = searched
    from planner.hardware import load_hardware

    plan = parallel_plan(result, prof, load_hardware("a100-80gb"))
    path = tmp_path / "plan.json"
    path.write_text(plan_to_json(plan))
    plan = load_plan(path)
    sim = simulate(plan, prof)
    best = result.best
    assert sim.iteration_ms == pytest.approx(best.iteration_ms, rel=1e-12)
    assert sim.replica.tokens_per_s == pytest.approx(best.tokens_per_s, rel=1e-12)
    assert sim.replica.mfu == pytest.approx(best.mfu, rel=1e-12)
    assert max(sim.peak_memory_bytes) == pytest.approx(best.peak_memory_bytes, rel=1e-12)
    assert sim.throughput_samples_per_s == pytest.approx(64 * 1e3 / sim.iteration_ms)  # over both replicas
    # ZeRO-1 over 2 replicas: each GPU keeps half of the 12 bytes of Adam state per parameter
    worst = sim.memory[0]
    assert worst.optimizer == pytest.approx(worst.weights * 12 / 2 / 2)
    a_rows = [r for r in sim.timeline if r.kind == "A"]
    assert len(a_rows) == plan.n_devices and sim.replica.grad_sync_ms > 0


def test_a_plan_that_does_not_name_its_hardware_needs_it(searched, tmp_path):
    prof, result = searched
    from planner.hardware import load_hardware

    data = json.loads(plan_to_json(parallel_plan(result, prof, load_hardware("a100-80gb"))))
    del data["parallel"]["hardware"], data["parallel"]["hardware_spec"], data["parallel"]["gpus_per_node"]
    del data["predicted"]["hardware"]
    plan = plan_from_dict(data)
    with pytest.raises(PlanError, match="--hardware"):
        simulate(plan, prof)
    again = simulate(plan, prof, hardware=load_hardware("a100-80gb"))  # gpus per node: the preset's 8
    assert again.iteration_ms == pytest.approx(result.best.iteration_ms, rel=1e-12)
    data["parallel"]["hardware"] = "/etc/hostname"  # a plan names presets only: no file is opened for it
    with pytest.raises(PlanError, match="not a preset"):
        simulate(plan_from_dict(data), prof)


def test_cluster_keys_round_trip_and_a_typo_names_the_key():
    cfg = ParallelConfig(dp=2, pp=4, tp=2, zero=1, gpus_per_node=8, hardware="h100-80gb")
    assert ParallelConfig.from_dict(cfg.to_dict()) == cfg and ParallelConfig.from_dict(cfg.to_dict()).hardware == "h100-80gb"
    assert replace(cfg, hardware=None) == cfg  # the cluster is not part of the layout's identity
    with pytest.raises(Exception, match="gpus_per_node"):
        ParallelConfig.from_dict({"dp": 2, "gpus_per_nod": 8})
    with pytest.raises(Exception, match="gpus_per_node"):
        ParallelConfig(gpus_per_node=0)


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_a_replica_peaks_in_its_optimizer_step_when_the_step_holds_more_than_the_activations(zero):
    # the step's temporaries (largest layer's, unsharded) stand for the activations when larger, as
    # planner.cost.stage_memory does for one pipeline: the engine prices the step moment with 0 activations
    import functools

    from planner.cost.parallel import replica_memory
    from planner.cost.precision import MIXED_BF16

    price = functools.partial(replica_memory, dp=2, zero=zero, precision=MIXED_BF16)
    stage = replace(_stage(), kept_bytes=1e6, optimizer_workspace_bytes=3e6)
    memory = simulate_costs(generate("1f1b", 1, 2), [stage], [0], [Device("gpu")], Links(), micro_batch_size=1,
                            memory_model=price).memory[0]
    assert memory.activations == 3e6 and memory.total == price([stage], 0.0).total
    small = replace(stage, optimizer_workspace_bytes=5e5)
    assert simulate_costs(generate("1f1b", 1, 2), [small], [0], [Device("gpu")], Links(), micro_batch_size=1,
                          memory_model=price).memory[0].activations >= 1e6
