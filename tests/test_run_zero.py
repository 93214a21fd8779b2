"""`pplan run` of ZeRO plans: dp = 2 x pp = 2 of the GPT with zero = 1, 2, 3 (planner.execute.zero).

Equivalence, bit for bit, with the single-process reference that accumulates each replica's
slice (planner.execute.reference), as tests/test_run_dp.py argues for zero = 0: every ZeRO stage
computes the same numbers in the same order. ZeRO-1's optimizer steps each parameter once, on
the replica that owns it, and broadcasts it; ZeRO-2/3's reduce-scatter averages two replicas'
gradients (one addition, one division by 2, as the all-reduce) before the division by M = 4
(a power of two, exact), and a sharded optimizer step is the whole step's arithmetic cut in
pieces (element-wise). One launch of 4 processes runs every plan of every ZeRO stage.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from planner.execute.checkpoint import latest_checkpoint, load_rank_file
from planner.execute.preflight import check_parallel
from planner.execute.reference import reference_run
from planner.plan import Plan, load_plan, plan_to_dict

from helpers.equivalence import EQUIVALENCE_THREADS, torch_threads
from helpers.models import BYOM_MODELS
from helpers.meshruns import GPT, dp_plan, launch, run_options

_REPO = Path(__file__).resolve().parents[1]
LR, STEPS = 1e-2, 3
TIED_ATOL = 1e-4  # as tests/test_byom_run.py: a tied weight's two gradients are added in another order
TWO = [(0, 2), (2, 4)]
GPT2_TIED, GPT2_SHAPE, _ = BYOM_MODELS["gpt2-tied"]
CNN, CNN_SHAPE, _ = BYOM_MODELS["cnn"]
# name: model, input shape, schedule, cuts, recompute, optimizer (zb: Adam, as test_run_dp's zb case)
PLANS = {
    "gpipe": (GPT, None, "gpipe", TWO, {0: [1]}, "sgd"),
    "1f1b": (GPT, None, "1f1b", TWO, {}, "sgd"),
    "zb": (GPT, None, "zb", TWO, {}, "adam"),  # split I/W backward on torch's CSV runtime
    "interleaved": (GPT, None, "interleaved", [(0, 1), (1, 2), (2, 3), (3, 4)], {}, "sgd"),
    # the tied embedding on both pipeline ranks, its head recomputed
    "gpt2-tied": (GPT2_TIED, GPT2_SHAPE, "1f1b", TWO, {1: [3]}, "adam"),
    # stage 1 (ReLU, MaxPool, Flatten) has no parameters: nothing to shard on that stage
    "cnn-parameter-free-stage": (CNN, CNN_SHAPE, "interleaved", [(0, 5), (5, 8), (8, 10), (10, 11)], {}, "sgd"),
}
_BUFFERS = ("running_mean", "running_var", "num_batches_tracked")  # BatchNorm statistics: each replica keeps its own


def zero_plan(folder: Path, name: str, zero: int) -> Plan:
    model, _, schedule, cuts, recompute, optimizer = PLANS[name]
    return load_plan(dp_plan(folder / f"{name}-zero{zero}.json", model, schedule, 2, cuts, micro_batch_size=2,
                             n_microbatches=4, recompute=recompute, optimizer=optimizer, seed=3,
                             parallel={"dp": 2, "pp": 2, "tp": 1, "zero": zero}))


def _replica_layers(ck: Path, plan: Plan, replica: int, step: int = STEPS) -> dict[int, dict]:
    _, newest = latest_checkpoint(ck, plan)
    folder = newest.with_name(f"step-{step:08d}")  # the resumed run kept the save it started from (KEEP = 2)
    out: dict[int, dict] = {}
    for r in (2 * replica, 2 * replica + 1):
        out.update(load_rank_file(folder, r)["layers"])
    return out


def _assert_same_weights(got: dict[int, dict], ref: dict[int, dict], what: str, atol: float = 0.0) -> None:
    assert sorted(got) == sorted(ref)
    for i, sd in ref.items():
        for name, want in sd.items():
            if not name.endswith(_BUFFERS):
                torch.testing.assert_close(got[i][name], want, rtol=0, atol=atol, msg=lambda m, i=i, n=name: f"{what} layer {i} {n}: {m}")


def test_zero_plans_pass_the_executor_checks(tmp_path):
    for zero in (1, 2, 3):
        check_parallel(zero_plan(tmp_path, "1f1b", zero))  # no refusal: every ZeRO stage runs


def test_a_weight_two_stages_of_one_rank_share_is_refused_under_zero_2_and_3():
    from types import SimpleNamespace

    from planner.errors import PplanError
    from planner.execute.stages import PipeStage
    from planner.execute.zero import shard_stages

    embed = torch.nn.Embedding(8, 4)
    head = torch.nn.Linear(4, 8, bias=False)
    head.weight = embed.weight  # tied ends of an interleaved plan: stages 0 and 3 on rank 0
    mods = [SimpleNamespace(stage=0, module=PipeStage([embed], None, None)), SimpleNamespace(stage=3, module=PipeStage([head], None, None))]
    with pytest.raises(PplanError, match="stages 0 and 3 of one rank share") as err:
        shard_stages(mods, None, 3)  # refused before any sharding (no process group needed)
    assert "\n" not in err.value.one_line() and '"zero": 1' in err.value.hint


SCHEDULES = {1: ["gpipe", "1f1b", "zb", "gpt2-tied"], 2: ["gpipe", "1f1b", "zb", "gpt2-tied"],
             3: ["gpipe", "1f1b", "zb", "interleaved", "gpt2-tied", "cnn-parameter-free-stage"]}


def _jobs(folder: Path, zero: int) -> tuple[dict[str, Plan], list[dict]]:
    """The plans of one ZeRO stage and their launch jobs: each plan's 3 steps, then one more step of
    the 1f1b plan resumed from its save of step 3 (sharded state gathered whole), then one more
    with the next ZeRO stage from that save (saves hold full tensors, whatever the stage)."""
    plans = {n: zero_plan(folder, n, zero) for n in SCHEDULES[zero]}
    jobs = [{"plan": plan_to_dict(plans[n]), "input_shape": PLANS[n][1], "options": run_options(folder / f"ck-{n}")}
            for n in SCHEDULES[zero]]
    other = zero_plan(folder, "1f1b", zero % 3 + 1)
    jobs.append({"plan": plan_to_dict(plans["1f1b"]), "options": run_options(folder / "ck-1f1b", steps=STEPS + 1)})
    jobs.append({"plan": plan_to_dict(other), "options": run_options(folder / "ck-1f1b", steps=STEPS + 2)})
    return plans, jobs


@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> dict[int, tuple[Path, dict[str, Plan], list[list[dict]]]]:
    """zero -> (its folder, its plans, its jobs' records): every ZeRO stage's jobs in one launch of
    4 processes (starting 4 ranks and importing torch and transformers costs seconds each time)."""
    base = tmp_path_factory.mktemp("zero")
    stages, jobs = {}, []
    for zero in (1, 2, 3):
        (folder := base / f"zero{zero}").mkdir()
        plans, own = _jobs(folder, zero)
        stages[zero] = (folder, plans, slice(len(jobs), len(jobs) + len(own)))
        jobs += own
    records = launch(jobs, 4, base / "launch")
    return {zero: (folder, plans, records[part]) for zero, (folder, plans, part) in stages.items()}


@pytest.mark.slow
@pytest.mark.parametrize("zero", [1, 2, 3])
def test_zero_dp2_pp2_equals_single_process_accumulation(launched, zero):
    folder, plans, records = launched[zero]
    names = SCHEDULES[zero]
    for n, recs in zip(names, records):
        shape = {"input_shape": PLANS[n][1]} if PLANS[n][1] else {}
        with torch_threads(EQUIVALENCE_THREADS):
            ref_losses, ref_layers = reference_run(plans[n], STEPS, lr=LR, model_kwargs=shape)
        tied = n == "gpt2-tied"
        losses = recs[1]["losses"]  # replica 0's last stage reports the step's mean over replicas
        assert [losses[str(k)] for k in range(STEPS)] == pytest.approx(ref_losses, rel=1e-6 if tied else 0, abs=0), n
        assert ref_losses[-1] != ref_losses[0]
        for replica in (0, 1) if n != "1f1b" else ():  # 1f1b's step-3 save gave way (KEEP = 2) to the resumed ones below
            # the save gathered every shard: both replicas hold the reference's weights
            got = _replica_layers(folder / f"ck-{n}", plans[n], replica)
            _assert_same_weights(got, ref_layers, f"{n} replica {replica}", atol=TIED_ATOL if tied else 0.0)
        # the gradient sync was timed on every rank: the all-reduce (zero 1) or the reduce-scatter (2, 3)
        assert all(r["grad_allreduce_ms"] and min(r["grad_allreduce_ms"]) > 0 for r in recs), n
    with torch_threads(EQUIVALENCE_THREADS):
        ref_losses, ref_layers = reference_run(plans["1f1b"], STEPS + 2, lr=LR)
    for k, resumed in ((STEPS, records[-2]), (STEPS + 1, records[-1])):
        assert resumed[1]["first_step"] == k
        assert resumed[1]["losses"][str(k)] == pytest.approx(ref_losses[k], rel=0, abs=0)
    for replica in (0, 1):
        got = _replica_layers(folder / "ck-1f1b", plans["1f1b"], replica, STEPS + 2)
        _assert_same_weights(got, ref_layers, f"resumed with zero {zero % 3 + 1}, replica {replica}")
    # measured memory: each replica holds about half the optimizer state (SGD momentum = one copy of the weights)
    saved = _replica_layers(folder / "ck-1f1b", plans["1f1b"], 0, STEPS + 2)
    layer_bytes = {i: sum(v.numel() * v.element_size() for v in sd.values()) for i, sd in saved.items()}  # GPT: no buffers
    for rank, rec in enumerate(records[1]):
        mem = rec["memory"]["breakdown"]
        mine = [layer_bytes[i] for i in range(*plans["1f1b"].stages[rank % 2].layers)]
        own = sum(mine)
        assert 0.25 * own < mem["optimizer"] < 0.75 * own, (rank, mem, own)
        assert mem["total"] == sum(v for k, v in mem.items() if k != "total")
        # weights: whole (zero 1); half at rest plus the stage gathered (2) or its largest layer gathered (3)
        assert mem["weights"] == {1: own, 2: own + own // 2, 3: own // 2 + max(mine)}[zero], (rank, mem, mine)
        assert mem["gradients"] >= (own if zero >= 2 else 0.99 * own)  # unsharded until the reduce-scatter
