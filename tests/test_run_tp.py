"""`pplan run` of tensor-parallel plans: the built-in gpt's blocks Megatron-style over the mesh's
"tp" dimension (planner.execute.tensor), pp = 2 x tp = 2 and dp = 2 x pp = 2 x tp = 2 (ZeRO 0, 1).

Equivalence with the single-process gradient accumulation (planner.execute.reference) is not
bit for bit: a row-parallel linear sums its two halves of the contraction and then adds them
over the tp ranks (an all-reduce), where the one process sums the whole row in one kernel, and
the input gradient of a column-parallel linear is likewise two halves added. Each such
reordering changes a float32 result by a few ulps (eps = 1.2e-7); three SGD steps at lr 1e-2
carry that into the weights. Measured: losses agree to 1.2e-8 relative, every weight tensor
to 4.8e-7 of its largest element. The tolerances, 1e-6 relative on losses and 1e-5 of each
tensor's largest element on weights, leave 20x margin and still fail on any real error (a wrong
head order or a missing all-reduce moves weights by 1e-3 or more). SGD, not Adam: Adam's first
step moves every weight by about lr x sign(gradient), so a gradient element that rounding
takes across zero moves by 2 lr (measured 2.9e-3 with Adam, on every schedule alike).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from planner.execute.checkpoint import FORMAT, latest_checkpoint, load_rank_file, rank_file_for
from planner.execute.mesh import coords, global_rank, tp_index
from planner.execute.preflight import check_parallel
from planner.execute.reference import reference_run
from planner.execute.tensor import qkv_order
from planner.plan import Plan, load_plan, plan_to_dict

from helpers.equivalence import EQUIVALENCE_THREADS, torch_threads
from helpers.meshruns import GPT, dp_plan, launch, run_options

LR, STEPS = 1e-2, 3
LOSS_RTOL, WEIGHT_TOL = 1e-6, 1e-5
TP2 = {"dp": 1, "pp": 2, "tp": 2, "zero": 0}
TWO = [(0, 2), (2, 4)]
# name: schedule, cuts, recompute
PLANS = {
    "gpipe": ("gpipe", TWO, {0: [1]}),  # block 0 recomputed: checkpointing around a tp block
    "1f1b": ("1f1b", TWO, {}),
    "zb": ("zb", TWO, {}),  # split I/W backward on torch's CSV runtime
    "interleaved": ("interleaved", [(0, 1), (1, 2), (2, 3), (3, 4)], {}),  # two stages per rank
}
SHARDED = ("qkv.weight", "qkv.bias", "fc1.weight", "fc1.bias", "proj.weight", "fc2.weight")  # halved over tp


def tp_plan(folder: Path, name: str, parallel: dict | None = None) -> Plan:
    schedule, cuts, recompute = PLANS[name]
    par = dict(parallel or TP2)
    tag = f"dp{par['dp']}-tp{par['tp']}-zero{par['zero']}"
    return load_plan(dp_plan(folder / f"{name}-{tag}.json", GPT, schedule, 2, cuts, micro_batch_size=2,
                             n_microbatches=4, recompute=recompute, optimizer="sgd", seed=3, parallel=par))


def test_mesh_layout_puts_tp_innermost(tmp_path):
    plan = tp_plan(tmp_path, "1f1b", {"dp": 2, "pp": 2, "tp": 2, "zero": 0})
    assert plan.n_processes == 8
    where = [(*coords(plan, r), tp_index(plan, r)) for r in range(8)]
    assert where == [(d, p, t) for d in range(2) for p in range(2) for t in range(2)]  # rank = (d P + p) T + t
    assert [global_rank(plan, *w) for w in where] == list(range(8))
    one = tp_plan(tmp_path, "1f1b", {"dp": 2, "pp": 2, "tp": 1, "zero": 0})  # tp = 1: rank = d P + p, as before
    assert [coords(one, r) for r in range(4)] == [(0, 0), (0, 1), (1, 0), (1, 1)] and one.n_processes == 4


def test_qkv_order_gives_each_tp_rank_q_k_v_of_its_own_heads():
    hidden, heads, tp = 8, 4, 2  # head_dim 2, 2 heads per tp rank
    order = qkv_order(hidden, heads, tp).view(tp, 3, heads // tp, hidden // heads)
    for t in range(tp):
        for s in range(3):  # q, k, v
            for h in range(heads // tp):
                head = t * heads // tp + h
                assert order[t, s, h].tolist() == [s * hidden + head * 2, s * hidden + head * 2 + 1]
    assert sorted(qkv_order(hidden, heads, 1).tolist()) == qkv_order(hidden, heads, 1).tolist()  # tp 1: identity


def test_tensor_parallel_gpt_plans_pass_the_executor_checks(tmp_path):
    from planner.errors import PplanError
    from planner.execute import RunOptions

    for par in (TP2, {"dp": 2, "pp": 2, "tp": 2, "zero": 0}):
        check_parallel(tp_plan(tmp_path, "1f1b", par))
    with pytest.raises(PplanError, match="--calibrate with tensor parallelism") as err:
        check_parallel(tp_plan(tmp_path, "1f1b"), RunOptions(steps=1, calibrate=True))
    assert "\n" not in err.value.one_line()


def test_one_rank_tp_block_computes_what_the_model_computes(tmp_path):
    """tp = 1 through the tp path (reordering, parallelize_module, the local-heads forward) is the
    model's own block, bit for bit: the tp forward is the same computation, not another one."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from planner.execute.tensor import full_layer_state, parallelize_blocks
    from planner.models import build_model

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        ref, tp = build_model(GPT, seed=3), build_model(GPT, seed=3)
        assert parallelize_blocks(list(tp.layers.children()), init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))) == 2
        x, y = ref.make_batch(4, 5)
        want, got = ref.layers(x), tp.layers(x)
        ref.loss_fn(want, y).backward()
        tp.loss_fn(got, y).backward()
        assert torch.equal(got, want)
        for (name, p), q in zip(tp.layers.named_parameters(), ref.layers.parameters()):
            grad = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
            assert torch.equal(grad, q.grad), name
        for layer, mine in zip(ref.layers.children(), tp.layers.children()):
            for k, v in full_layer_state(mine).items():
                assert torch.equal(v, layer.state_dict()[k]), k
    finally:
        dist.destroy_process_group()


def test_a_resume_reads_the_file_of_its_replica_position_and_tp_rank(tmp_path):
    def save(tp: int, dp: int) -> Path:
        folder = tmp_path / f"tp{tp}-dp{dp}"
        folder.mkdir()
        (folder / "COMPLETE.json").write_text(json.dumps({"format": FORMAT, "dp": dp, "tp": tp}))
        return folder

    # saved with dp 1, tp 2 (ranks: pp 0 -> 0, 1; pp 1 -> 2, 3), resumed with tp 1 and with dp 2 x tp 2
    folder = save(2, 1)
    assert [rank_file_for(folder, r, r, dp_index=0, tp_index=0, n_devices=2) for r in range(2)] == [0, 2]
    assert [rank_file_for(folder, r, p, dp_index=d, tp_index=t, n_devices=2)
            for r, (d, p, t) in enumerate((d, p, t) for d in range(2) for p in range(2) for t in range(2))] == [0, 1, 2, 3] * 2
    # saved with dp 2, tp 1 (rank = d P + p), resumed with tp 2: tp rank 1 reads tp rank 0's file
    folder = save(1, 2)
    assert [rank_file_for(folder, r, p, dp_index=d, tp_index=t, n_devices=2)
            for r, (d, p, t) in enumerate((d, p, t) for d in range(2) for p in range(2) for t in range(2))] == [0, 0, 1, 1, 2, 2, 3, 3]


def _layers(ck: Path, plan: Plan, step: int, ranks: list[int]) -> list[dict[int, dict]]:
    """Per rank, its save's layers (full tensors in the model's layout) at `step`."""
    _, newest = latest_checkpoint(ck, plan)
    folder = newest.with_name(f"step-{step:08d}")
    return [load_rank_file(folder, r)["layers"] for r in ranks]


def _assert_close_weights(got: dict[int, dict], ref: dict[int, dict], what: str) -> None:
    """`got`: some layers' saved state (a rank's stages), each close to the reference's."""
    assert got and set(got) <= set(ref), what
    for i, sd in got.items():
        assert sorted(sd) == sorted(ref[i]), (what, i)
        for name, want in ref[i].items():
            err = float((got[i][name] - want).abs().max())
            assert err <= WEIGHT_TOL * float(want.abs().max()), f"{what} layer {i} {name}: max error {err:.3g}"


def _check_run(name: str, plan: Plan, recs: list[dict], ck: Path) -> None:
    world = plan.n_processes
    with torch_threads(EQUIVALENCE_THREADS):
        ref_losses, ref_layers = reference_run(plan, STEPS, lr=LR)
    reporting = [r for r in recs if r["losses"]]
    assert len(reporting) == 1, name  # the last stage's tp rank 0 of replica 0 reports the losses
    losses = reporting[0]["losses"]
    assert [losses[str(k)] for k in range(STEPS)] == pytest.approx(ref_losses, rel=LOSS_RTOL, abs=0), name
    assert ref_losses[-1] != ref_losses[0]
    saved = _layers(ck, plan, STEPS, list(range(world)))
    assert {i for sd in saved for i in sd} == set(ref_layers), name
    for r in range(world):
        _assert_close_weights(saved[r], ref_layers, f"{name} rank {r}")
        # tp ranks (and replicas) hold the same full weights: replicated ones never drifted apart
        for i, sd in saved[r].items():
            base = saved[r - r % 2][i]  # tp rank 0 of the same pipeline position
            assert all(torch.equal(v, base[k]) for k, v in sd.items()), (name, r, i)


def _assert_memory_holds_the_shards(plan: Plan, recs: list[dict], layers: dict[int, dict]) -> None:
    for rank, rec in enumerate(recs):
        mem = rec["memory"]["breakdown"]
        stage_layers = [i for s in plan.stages if s.device == coords(plan, rank)[1] for i in range(*s.layers)]
        full = sum(v.numel() * v.element_size() for i in stage_layers for v in layers[i].values())
        halved = sum(v.numel() * v.element_size() for i in stage_layers for k, v in layers[i].items() if k.endswith(SHARDED))
        assert mem["weights"] == full - halved // 2, (rank, mem, full, halved)
        assert mem["gradients"] == mem["weights"] and mem["optimizer"] == mem["weights"]  # SGD momentum


@pytest.mark.slow
def test_pp2_tp2_equals_single_process_accumulation(tmp_path):
    """One launch of 4 processes runs gpipe (recompute), 1f1b, zb and interleaved, then one more
    1f1b step resumed from its save; a 2-process launch resumes that save with tp = 1."""
    names = list(PLANS)
    plans = {n: tp_plan(tmp_path, n) for n in names}
    jobs = [{"plan": plan_to_dict(plans[n]), "options": run_options(tmp_path / f"ck-{n}")} for n in names]
    jobs.append({"plan": plan_to_dict(plans["1f1b"]), "options": run_options(tmp_path / "ck-1f1b", steps=STEPS + 1)})
    records = launch(jobs, 4, tmp_path / "launch")
    for n, recs in zip(names, records):
        if n != "1f1b":  # 1f1b's step-3 save is checked below, after the resumed runs
            _check_run(n, plans[n], recs, tmp_path / f"ck-{n}")
    layers = _layers(tmp_path / "ck-gpipe", plans["gpipe"], STEPS, [0, 2])
    _assert_memory_holds_the_shards(plans["1f1b"], records[1], {**layers[0], **layers[1]})
    # the same checkpoint resumed with tp = 1 (2 processes): saves hold full tensors in model layout
    one = tp_plan(tmp_path, "1f1b", {"dp": 1, "pp": 2, "tp": 1, "zero": 0})
    resumed = launch([{"plan": plan_to_dict(one), "options": run_options(tmp_path / "ck-1f1b", steps=STEPS + 2)}], 2,
                     tmp_path / "launch-tp1")[0]
    with torch_threads(EQUIVALENCE_THREADS):
        ref_losses, ref_layers = reference_run(plans["1f1b"], STEPS + 2, lr=LR)
    first = next(r for r in records[1] if r["losses"])["losses"]  # the uninterrupted 1f1b steps
    assert [first[str(k)] for k in range(STEPS)] == pytest.approx(ref_losses[:STEPS], rel=LOSS_RTOL, abs=0)
    for k, recs in ((STEPS, records[-1]), (STEPS + 1, resumed)):
        rec = next(r for r in recs if r["losses"])
        assert rec["first_step"] == k
        assert rec["losses"][str(k)] == pytest.approx(ref_losses[k], rel=LOSS_RTOL, abs=0)
    got = _layers(tmp_path / "ck-1f1b", one, STEPS + 2, [0, 1])
    _assert_close_weights({**got[0], **got[1]}, ref_layers, "1f1b resumed tp 2 -> 1")


@pytest.mark.slow
def test_dp2_pp2_tp2_with_zero_0_and_1_equals_single_process_accumulation(tmp_path):
    """One launch of 8 processes (about 40 s on 2 cores): the dp all-reduce sums each rank's
    local tp shards; ZeRO-1 steps them through LocalShardsOptimizer. Then each resumes the
    other's save: a zero-0 save into ZeRO-1's per-shard state (step 4), and that ZeRO-1 save,
    gathered over dp and tp, back into zero 0 (step 5); SGD's momentum must survive both."""
    plans = {z: tp_plan(tmp_path, "1f1b", {"dp": 2, "pp": 2, "tp": 2, "zero": z}) for z in (0, 1)}
    ck = {z: tmp_path / f"ck-{z}" for z in (0, 1)}
    jobs = [{"plan": plan_to_dict(plans[z]), "options": run_options(ck[z])} for z in (0, 1)]
    jobs += [{"plan": plan_to_dict(plans[1]), "options": run_options(ck[0], steps=STEPS + 1)},
             {"plan": plan_to_dict(plans[0]), "options": run_options(ck[0], steps=STEPS + 2)}]
    records = launch(jobs, 8, tmp_path / "launch")
    _check_run("dp2-zero1", plans[1], records[1], ck[1])
    for rank, rec in enumerate(records[1]):  # ZeRO-1: each replica keeps about half the momentum
        mem = rec["memory"]["breakdown"]
        assert 0.25 * mem["weights"] < mem["optimizer"] < 0.75 * mem["weights"], (rank, mem)
    assert all(r["grad_allreduce_ms"] and min(r["grad_allreduce_ms"]) > 0 for recs in records[:2] for r in recs)
    with torch_threads(EQUIVALENCE_THREADS):
        ref_losses, ref_layers = reference_run(plans[0], STEPS + 2, lr=LR)
    first = next(r for r in records[0] if r["losses"])["losses"]
    assert [first[str(k)] for k in range(STEPS)] == pytest.approx(ref_losses[:STEPS], rel=LOSS_RTOL, abs=0)
    for k, recs in ((STEPS, records[2]), (STEPS + 1, records[3])):
        rec = next(r for r in recs if r["losses"])
        assert rec["first_step"] == k
        assert rec["losses"][str(k)] == pytest.approx(ref_losses[k], rel=LOSS_RTOL, abs=0), k
    for r, got in enumerate(_layers(ck[0], plans[0], STEPS + 2, list(range(8)))):
        _assert_close_weights(got, ref_layers, f"resumed zero 0 -> 1 -> 0, rank {r}")
