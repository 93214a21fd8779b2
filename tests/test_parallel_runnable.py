"""The data x pipeline x tensor search writes what `pplan run` executes, priced as it executes it:
the layout's own ZeRO stage, no ZeRO-2/3 with tensor parallelism, the gradient sync after the
step unless asked, the searched memory as the plan's limit, and the table's numbers in --json.
And the benches check their settings where a library caller meets them."""

import json

import pytest

from planner.errors import InfeasibleError, PplanError
from planner.parallel import ParallelConfig, parse_parallel
from planner.partition.parallel_plan import parallel_plan
from planner.partition.parallel_search import plan_parallel
from planner.plan import load_plan, plan_from_dict, plan_to_dict
from planner.units import parse_bytes

SPEC = "gpt:layers=8,hidden=2048,heads=16,seq=1024,vocab=32000"
SMALL = "gpt:layers=8,hidden=1024,heads=16,seq=512,vocab=32000"
KW = dict(model=SPEC, hardware="a100-80gb", nodes=1, gpus_per_node=8, global_batch=64)


def test_the_layouts_zero_wins_and_a_contradicting_zero_is_refused():
    r = plan_parallel(parallel="dp=2,pp=2,tp=2,zero=1", schedules=("1f1b",), **KW)
    assert {c.config.zero for c in r.candidates} == {1}
    assert r.best.memory.optimizer == pytest.approx(plan_parallel(parallel="dp=2,pp=2,tp=2", zero=1, schedules=("1f1b",),
                                                                  **KW).best.memory.optimizer)
    with pytest.raises(PplanError, match="zero=1 but --zero is 3"):
        plan_parallel(parallel="dp=2,pp=2,tp=2,zero=1", zero=3, **KW)
    with pytest.raises(PplanError, match="ZeRO stage 1 but zero=0"):
        plan_parallel(parallel=ParallelConfig(dp=2, pp=2, tp=2, zero=1), zero=0, **KW)
    assert parse_parallel("dp=2,zero=2", 2).zero == 2 and parse_parallel("dp=2", 3).zero == 3


def test_zero_2_or_3_with_tensor_parallelism_is_left_out_or_refused():
    from planner.parallel import run_refusal

    cfg = ParallelConfig(dp=2, pp=2, tp=2, zero=3)
    assert "ZeRO stage 3 with tensor parallelism (tp 2)" in run_refusal(cfg)
    assert run_refusal(ParallelConfig(dp=2, pp=2, tp=2, zero=1)) is None and run_refusal(ParallelConfig(dp=1, pp=4, tp=2, zero=3)) is None
    with pytest.raises(PplanError, match="not supported by pplan run") as e:
        plan_parallel(parallel="dp=2,pp=2,tp=2", zero=3, **KW)
    assert "dp=2,pp=2,tp=2,zero=1" in e.value.hint
    r = plan_parallel(zero=2, **KW)
    assert all(run_refusal(c.config) is None for c in r.candidates)
    assert any("dp=2,pp=1,tp=4,zero=2: ZeRO stage 2 with tensor parallelism" in s for s in r.skipped)


def test_no_zero_stage_is_offered_when_none_would_fit_the_weights():
    big = "gpt:layers=96,hidden=12288,heads=96,seq=2048,vocab=51200"
    for zero in (0, 1):
        with pytest.raises(InfeasibleError) as e:
            plan_parallel(model=big, hardware="a100-80gb", nodes=1, global_batch=1536, zero=zero)
        assert "--zero" not in e.value.hint
    # 1500 MiB: the weights fit under ZeRO-1 but no plan does (activations), so it is not offered
    with pytest.raises(InfeasibleError) as e:
        plan_parallel(memory_bytes=1500 * 2**20, **KW)
    assert "--zero" not in e.value.hint
    with pytest.raises(InfeasibleError):
        plan_parallel(memory_bytes=1500 * 2**20, zero=1, **KW)


def test_the_static_bound_keeps_embedding_and_head_whole_on_every_tp_rank(analytic_profile):
    from planner.profiling.profile import load_profile

    prof = load_profile(analytic_profile(SMALL, "1,2"))
    with pytest.raises(InfeasibleError) as e:
        plan_parallel(prof, hardware="a100-80gb", nodes=2, global_batch=64, parallel="dp=1,pp=2,tp=8", memory_bytes=150e6)
    params = prof.columns["param_bytes"][:, 0] / 2  # bfloat16: 2 bytes a parameter, 16 of state each
    embed_state = 16 * float(params[0])  # one pipeline rank holds the whole embedding, whatever tp
    need = parse_bytes(e.value.hint.split("needs about ")[1].split(" per GPU")[0], "need")
    assert need >= embed_state


def test_the_plan_records_the_searched_memory_its_devices_and_runners_up(analytic_profile):
    from planner.profiling.profile import load_profile

    prof = load_profile(analytic_profile(SMALL, "1,2,4"))
    result = plan_parallel(prof, hardware="a100-80gb", nodes=2, global_batch=64, parallel="dp=2,pp=4,tp=2",
                           memory_bytes=parse_bytes("1GiB"))
    from planner.hardware import load_hardware

    plan = plan_from_dict(plan_to_dict(parallel_plan(result, prof, load_hardware("a100-80gb"))))
    assert [d.memory_bytes for d in plan.devices] == [2**30] * 4
    devices = plan.predicted.devices
    assert [d.memory_limit_bytes for d in devices] == [2**30] * 4
    assert max(d.peak_memory_bytes for d in devices) == int(result.best.peak_memory_bytes)
    assert len(plan.search.candidates) == len(result.candidates) - 1
    assert plan.search.candidates[0].note.startswith("dp=2,pp=4,tp=2 ")


def test_grad_sync_is_priced_after_the_step_unless_asked_and_recorded():
    kw = dict(KW, parallel="dp=4,pp=2,tp=1", schedules=("1f1b",), recompute="none")
    after, overlapped = plan_parallel(**kw), plan_parallel(overlap_grad_sync=True, **kw)
    assert (after.grad_sync, overlapped.grad_sync) == ("after-step", "overlapped")
    assert after.best.grad_sync_ms > 0 and after.best.iteration_ms > overlapped.best.iteration_ms
    cfg = ParallelConfig(dp=4, pp=2, grad_sync="after-step")
    assert ParallelConfig.from_dict(cfg.to_dict()).grad_sync == "after-step" and not cfg.overlaps_grad_sync
    assert ParallelConfig.from_dict({"dp": 4, "pp": 2}).overlaps_grad_sync  # written before the key: priced overlapped
    with pytest.raises(PplanError, match="grad_sync must be one of"):
        ParallelConfig.from_dict({"dp": 4, "grad_sync": "sometimes"})


def test_partition_nodes_json_prints_the_summary_and_the_plan_with_its_limits(pplan, analytic_profile, tmp_path):
    csv, out = analytic_profile(SMALL, "1,2,4"), tmp_path / "plan.json"
    code, stdout, err = pplan("partition", csv, "--nodes", 2, "--hardware", "a100-80gb", "--global-batch", 64,
                              "--parallel", "dp=2,pp=4,tp=2", "--memory", "1GiB", "--grad-sync", "overlapped",
                              "--out", out, "--json")
    assert code == 0, err
    got = json.loads(stdout)
    assert {"plan", "summary", "out", "basis", "calibration"} <= set(got)
    best = got["summary"]["candidates"][0]
    assert best["peak_memory_bytes"] <= 2**30 and best["fits"] and best["memory"]["total"] == best["peak_memory_bytes"]
    assert got["summary"]["memory_per_gpu_bytes"] == 2**30 and got["summary"]["grad_sync"] == "overlapped"
    plan = load_plan(out)
    assert plan.parallel.grad_sync == "overlapped" and [d.memory_bytes for d in plan.devices] == [2**30] * 4
    assert pplan("partition", csv, "--nodes", 2, "--hardware", "a100-80gb", "--global-batch", 64,
                 "--grad-sync", "sometimes", "--out", out)[0] == 2


def test_the_benches_check_their_settings_as_library_calls(monkeypatch):
    """`pplan bench`'s checks live in the bench functions, so a library caller meets them before any work."""
    import planner.bench.quality as quality
    from planner.bench import bench_quality_measured, bench_simulator

    with pytest.raises(PplanError, match="64x100000 under zb: .* actions to simulate, beyond the simulator's bound"):
        bench_simulator(sizes=[(64, 100_000)])
    with pytest.raises(PplanError, match="repeats a size"):
        bench_simulator(sizes=[(8, 64), (8, 64)])
    with pytest.raises(PplanError, match="--repeats 0 must be between 1 and 1000"):
        bench_simulator(sizes=[(8, 64)], repeat=0)
    monkeypatch.setattr(quality.tempfile, "TemporaryDirectory", None)  # nothing may be profiled or trained
    for steps, warmup, device, says in ((5, 2, "gpu", "--device 'gpu' is unknown"), (2, 2, "cpu", "0 <= warmup < steps")):
        with pytest.raises(PplanError, match=says):
            bench_quality_measured(steps=steps, warmup=warmup, device=device)


@pytest.mark.parametrize("cfg, model", [
    (ParallelConfig(dp=2, pp=2, tp=4, zero=3), SMALL),  # ZeRO-3 with tp: ZeRO-1, or its tp ranks moved into dp
    (ParallelConfig(dp=1, pp=1, tp=8), "gpt:layers=2,hidden=768,heads=12,seq=128,vocab=1000"),  # tp 8 does not divide 12 heads
    (ParallelConfig(dp=1, pp=2, tp=4), None),  # no model spec: tp = 1 only
])
def test_the_runnable_alternatives_are_those_whose_dp_divides_the_global_batch(cfg, model):
    from planner.partition.parallel_runnable import layout_error, runnable_alternatives

    every = runnable_alternatives(cfg, model, 8)
    assert every and all(layout_error(c, model) is None for c in every)
    assert any(c.dp > cfg.dp for c in every)  # some alternative moves tp ranks into dp
    for batch in range(1, 33):
        split = runnable_alternatives(cfg, model, 8, batch)
        assert split == [c for c in every if batch % c.dp == 0], batch
    assert runnable_alternatives(cfg, model, 8, 1) == []  # every alternative has dp > 1 here: none splits one sample


def test_a_refused_layout_whose_alternatives_cannot_split_the_batch_says_so():
    # tp 8 does not divide 12 heads; every runnable alternative moves tp ranks into dp (2, 4, 8),
    # and none of those splits a global batch of 3
    with pytest.raises(PplanError) as e:
        plan_parallel(model="gpt:layers=2,hidden=768,heads=12,seq=128,vocab=1000", hardware="a100-80gb", nodes=1,
                      gpus_per_node=8, global_batch=3, parallel="dp=1,pp=1,tp=8")
    assert "splits --global-batch 3" in e.value.hint and "--parallel" not in e.value.hint
    with pytest.raises(PplanError) as e:
        plan_parallel(model="gpt:layers=2,hidden=768,heads=12,seq=128,vocab=1000", hardware="a100-80gb", nodes=1,
                      gpus_per_node=8, global_batch=4, parallel="dp=1,pp=1,tp=8")
    assert "--parallel dp=2,pp=1,tp=4" in e.value.hint
