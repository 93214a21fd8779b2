"""Your own training loop, cut and scheduled as a pplan plan says.

    pplan profile   --model gpt:layers=2,hidden=64,heads=2,seq=32,vocab=512 --threads 1 -o gpt.csv
    pplan partition gpt.csv --devices 2 --global-batch 16 -o plan.json
    torchrun --nproc-per-node 2 examples/train_with_plan.py plan.json --steps 5

(any plan works: processes = the plan's devices x its data-parallel degree, e.g. 4 for
"parallel": {"dp": 2, "pp": 2, ...}). Every process builds the same model, `build_pipeline`
keeps this rank's planned stages (recompute layers checkpointed) and returns torch's
PipelineStage objects and schedule; the loop below is torch's own: `schedule.step(...)`, then the
plan's optimizer (`pipe.make_optimizer`: sgd/adam/adamw, fp32 master weights for a bfloat16 plan,
ZeRO-1 sharding). With lr 1e-3 and the same batches, the losses equal
`pplan run plan.json --threads 1 --lr 1e-3`'s.

A plan naming a `module:factory` model runs that Python code: as with `pplan run`, it is refused
unless you vouch for it with `--model SPEC` (the same string) or `--trust-model`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist

from planner import build_pipeline, build_plan_model, load_plan
from planner.errors import PplanError
from planner.execute.stages import step_seed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("plan", help="plan JSON written by `pplan partition`")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--out", help="rank 0 writes the losses here as JSON")
    ap.add_argument("--model", help="the plan's model spec, repeated to vouch for a module:factory model")
    ap.add_argument("--trust-model", action="store_true", help="run the plan's module:factory model as it is")
    args = ap.parse_args()

    dist.init_process_group("gloo")  # torchrun sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank = dist.get_rank()
    plan = load_plan(args.plan)

    try:
        # Your model: an nn.Sequential whose children are the plan's layers, the same weights on every
        # rank, and a loss. Here the model the plan names, from its seed, in its profile's dtype; a
        # module:factory model is code the plan file names: refused before its module is imported
        # unless vouched for.
        bundle = build_plan_model(plan, args.plan, model=args.model, trust_model=args.trust_model)
        pipe = build_pipeline(plan, bundle.layers, rank=rank, loss_fn=bundle.loss_fn,
                              example=bundle.make_batch(plan.micro_batch_size, 0)[0])  # one micro-batch's input
    except PplanError as e:  # an unvouched model, a plan this job cannot run (another process count, ...): one
        # line per rank, printed before anything exits (torchrun stops the other ranks once one has, so rank 0
        # alone may never get here)
        print(f"rank {rank}: error: {e.one_line()}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(2)  # not sys.exit: gloo's threads can abort the teardown (SIGABRT) and lose the exit code
    print(f"rank {rank}: stages {pipe.stage_ids} (replica {pipe.dp_index}), {type(pipe.schedule).__name__}, "
          f"{plan.n_microbatches} micro-batches of {plan.micro_batch_size}", flush=True)
    opt = pipe.make_optimizer(args.lr)  # the plan's optimizer, as pplan run makes it

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
