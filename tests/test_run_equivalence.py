"""Pipelined training is synchronous: losses and final weights equal a single-process run with
gradient accumulation over the same micro-batches, bit for bit (multi-process, slow).

Why exact: everything that decides the bits is pinned. Fixed cuts; the same kernels on the same
micro-batch shapes in the same order; the same torch thread count in the ranks and in the
reference (EQUIVALENCE_THREADS: CPU kernels split reductions by thread, so 1 vs 2 threads
reorders float32 sums); M = 4, a power of two, so scaling each micro-batch loss by 1/M (the
reference) and scaling the accumulated gradients by 1/M (torch's schedules) are both exact.
Recompute replays the same forward kernels. Nothing is left to reorder, so any difference is
an executor bug. A tolerance could not replace the pinning: Adam's step lr * m / (sqrt(v) + eps)
ignores the gradient's scale, so a 1-ulp reordering in a near-zero gradient element moves that
weight by a large fraction of lr.
"""

from __future__ import annotations

import pytest
import torch

from planner.execute import RunOptions
from planner.execute.checkpoint import latest_checkpoint, load_rank_file
from planner.execute.reference import reference_run
from planner.execute.run import run_plan
from planner.plan import load_plan

from helpers.equivalence import EQUIVALENCE_THREADS, torch_threads
from helpers.plans import write_plan

MLP = "mlp:layers=4,hidden=32,input=16,classes=8"
GPT = "gpt:layers=2,hidden=32,heads=2,seq=16,vocab=128,ffn=2"
STEPS = 3

CASES = [
    # model, schedule, stage cuts, recompute per stage, optimizer
    (MLP, "gpipe", [(0, 2), (2, 4)], {}, "adam"),
    (MLP, "1f1b", [(0, 2), (2, 4)], {0: [0, 1], 1: [3]}, "adamw"),
    # GPT with SGD: the key bias has a zero gradient up to rounding, which Adam's normalisation
    # would blow up into full-size steps of noise (identical in both runs, but meaningless)
    (GPT, "gpipe", [(0, 2), (2, 4)], {0: [1], 1: [2]}, "sgd"),
    (GPT, "1f1b", [(0, 1), (1, 4)], {}, "sgd"),
    (MLP, "zb", [(0, 2), (2, 4)], {1: [2]}, "adam"),
    (GPT, "interleaved", [(0, 1), (1, 2), (2, 3), (3, 4)], {1: [1]}, "sgd"),
]


def _final_layers(root, plan) -> dict[int, dict]:
    _, folder = latest_checkpoint(root, plan)
    out: dict[int, dict] = {}
    for r in range(plan.n_devices):
        out.update(load_rank_file(folder, r)["layers"])
    return out


@pytest.mark.slow
@pytest.mark.parametrize("model,schedule,cuts,recompute,optimizer", CASES,
                         ids=[f"{c[0].split(':')[0]}-{c[1]}-{'rec' if c[3] else 'norec'}" for c in CASES])
def test_pipelined_run_equals_single_process_accumulation(tmp_path, model, schedule, cuts, recompute, optimizer):
    plan = load_plan(write_plan(tmp_path / "plan.json", model, schedule, 2, cuts, micro_batch_size=2,
                                n_microbatches=4, recompute=recompute, optimizer=optimizer, seed=3))
    assert plan.n_microbatches == 4  # a power of two: see the module docstring
    opts = RunOptions(steps=STEPS, warmup=1, device="cpu", lr=1e-2, threads=EQUIVALENCE_THREADS,
                      checkpoint_dir=str(tmp_path / "ck"))
    outcome = run_plan(plan, opts, plan_path=str(tmp_path / "plan.json"))
    run = outcome.record.to_dict()
    with torch_threads(EQUIVALENCE_THREADS):
        ref_losses, ref_layers = reference_run(plan, STEPS, lr=1e-2)
    assert run["loss_steps"] == list(range(STEPS))
    # both average the same four float32 micro-batch losses in float64, possibly in another
    # order: a few float64 ulps at most
    assert run["losses"] == pytest.approx(ref_losses, rel=1e-12, abs=0)
    assert ref_losses[-1] != ref_losses[0]  # training moved the weights
    got = _final_layers(tmp_path / "ck", plan)
    assert sorted(got) == sorted(ref_layers)
    for i, sd in ref_layers.items():
        for name, ref in sd.items():
            torch.testing.assert_close(got[i][name], ref, rtol=0, atol=0, msg=lambda m, i=i, n=name: f"layer {i} {n}: {m}")
    # the executed order was checked against the planner's on the first step; the timeline shows it
    per_device = {}
    for row in outcome.timeline:
        if row.kind in "FBIW":
            per_device.setdefault(row.device, []).append(f"{row.stage}{row.kind}{row.microbatch}")
    from planner.schedules import generate

    sched = generate(schedule, 2, 4, len(cuts) // 2)
    for rank in range(2):
        assert per_device[plan.stages[rank].device] == [str(a) for a in sched.actions(rank)]
