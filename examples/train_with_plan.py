"""Your own training loop, cut and scheduled as a pplan plan says.

    pplan profile   --model gpt:layers=2,hidden=64,heads=2,seq=32,vocab=512 --threads 1 -o gpt.csv
    pplan partition gpt.csv --devices 2 --global-batch 16 -o plan.json
    torchrun --nproc-per-node 2 examples/train_with_plan.py plan.json --steps 5

(any plan works: processes = the plan's devices x its data-parallel degree, e.g. 4 for
"parallel": {"dp": 2, "pp": 2, ...}). Every process builds the same model, `build_pipeline`
keeps this rank's planned stages (recompute layers checkpointed) and returns torch's
PipelineStage objects and schedule; the loop below is torch's own: `schedule.step(...)`, then an
optimizer step. With the plan's optimizer (adam here), lr 1e-3 and the same batches, the losses
equal `pplan run plan.json --threads 1 --lr 1e-3`'s.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist

from planner import build_pipeline, load_plan
from planner.errors import PplanError
from planner.execute.stages import step_seed
from planner.models import build_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("plan", help="plan JSON written by `pplan partition`")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--out", help="rank 0 writes the losses here as JSON")
    args = ap.parse_args()

    dist.init_process_group("gloo")  # torchrun sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank = dist.get_rank()
    plan = load_plan(args.plan)

    # Your model: an nn.Sequential whose children are the plan's layers, the same weights on every
    # rank (here the built-in model the plan names, built from the plan's seed), and a loss.
    bundle = build_model(plan.model, seed=plan.seed)
    model, loss_fn = bundle.layers, bundle.loss_fn

    try:
        pipe = build_pipeline(plan, model, rank=rank, loss_fn=loss_fn,
                              example=bundle.make_batch(plan.micro_batch_size, 0)[0])  # one micro-batch's input
    except PplanError as e:  # a plan this job cannot run (another process count, ...): one line per rank,
        # printed before anything exits (torchrun stops the other ranks once one has, so rank 0 alone may never get here)
        print(f"rank {rank}: error: {e.one_line()}", file=sys.stderr, flush=True)
        sys.exit(2)
    print(f"rank {rank}: stages {pipe.stage_ids} (replica {pipe.dp_index}), {type(pipe.schedule).__name__}, "
          f"{plan.n_microbatches} micro-batches of {plan.micro_batch_size}", flush=True)
    opt = torch.optim.Adam(pipe.parameters(), lr=args.lr)

    losses_per_step = []
    for step in range(args.steps):
        x, y = bundle.make_batch(plan.global_batch, step_seed(plan.seed, step))  # the global batch
        x, y = pipe.local_batch(x), pipe.local_batch(y)                         # this replica's slice
        losses: list[torch.Tensor] = []
        if pipe.is_first:
            pipe.schedule.step(x, target=y if pipe.is_last else None, losses=losses)
        elif pipe.is_last:
            pipe.schedule.step(target=y, losses=losses)
        else:
            pipe.schedule.step()
        pipe.sync_gradients()  # tied weights across stages; the data-parallel all-reduce (dp > 1)
        opt.step()
        opt.zero_grad(set_to_none=True)

        # the step's loss lives on the last stage, on each of its replicas' tensor-parallel ranks: share
        # it with rank 0 as the mean over the ranks that hold one (each its micro-batches' mean)
        loss = torch.tensor([torch.stack([v.detach().double() for v in losses]).mean().item() if losses else 0.0,
                             1.0 if losses else 0.0], dtype=torch.float64)
        dist.all_reduce(loss)
        mean = loss[0].item() / loss[1].item()
        losses_per_step.append(mean)
        if rank == 0:
            print(f"step {step + 1}/{args.steps}  loss {mean:.6f}", flush=True)

    if rank == 0 and args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump({"losses": losses_per_step}, fh)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # torch 2.13's gloo threads can abort the interpreter's teardown ("terminate called without an
    # active exception", SIGABRT) after every step is done and saved; leave without it, as pplan
    # run's own ranks do.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
