"""Multi-process runs of data x pipeline x tensor plans for the tests (test_run_dp, test_run_zero,
test_run_tp): a plan with a `parallel` object, and `launch`, which trains several such plans one
after the other in the same processes (one torch import and process group for them all)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import torch

from helpers.equivalence import EQUIVALENCE_THREADS
from helpers.plans import write_plan

__all__ = ["GPT", "DP2", "dp_plan", "launch", "rank_main", "run_options"]

_REPO = Path(__file__).resolve().parents[2]
GPT = "gpt:layers=2,hidden=32,heads=2,seq=16,vocab=128,ffn=2"
DP2 = {"dp": 2, "pp": 2, "tp": 1, "zero": 0}


def dp_plan(path: Path, *args, parallel: dict | None = None, **kwargs) -> Path:
    """write_plan, plus the plan's `parallel` object."""
    write_plan(path, *args, **kwargs)
    data = json.loads(path.read_text())
    data["parallel"] = dict(parallel or DP2)
    path.write_text(json.dumps(data, indent=1))
    return path


def launch(jobs: list[dict], world: int, folder: Path, timeout_s: float = 600.0) -> list[list[dict]]:
    """Run train_rank for each job ({"plan", "options", optional "input_shape"}) one after the other
    in the same `world` processes and process group: starting a rank and importing torch (and
    transformers) costs seconds, a tiny plan's steps a fraction of one. Returns per job the
    records of every rank (losses, memory, all-reduce times); raises AssertionError naming the
    plan and the rank's own error when a rank fails."""
    from planner.execute.launch import free_port
    from planner.warm_start import start_rank_process

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "jobs.json").write_text(json.dumps(jobs), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(world), OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(_REPO / "tests"), str(_REPO), env.get("PYTHONPATH", "")]))
    procs = []
    for r in range(world):  # started as `pplan run` starts its ranks (warm, unless PPLAN_WARM_START=0)
        with open(folder / f"rank{r}.log", "wb") as log:
            procs.append(start_rank_process("helpers.meshruns:rank_main", [str(folder)], dict(env, RANK=str(r)),
                                            name=f"pplan-rank{r}", cwd=_REPO, stdout=log, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + timeout_s
    try:
        while any(p.poll() is None for p in procs) and not any(p.poll() for p in procs):
            if time.monotonic() > deadline:
                raise AssertionError(f"a {world}-rank launch ran past {timeout_s:g} s; logs in {folder}")
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    failed = [r for r, p in enumerate(procs) if p.returncode != 0]
    if failed:
        # the rank whose own error it is, not a peer that lost its connection to it
        errors = sorted(folder.glob("rank*.error"), key=lambda f: "Connection closed" in f.read_text(encoding="utf-8"))
        why = errors[0].read_text(encoding="utf-8") if errors else (folder / f"rank{failed[0]}.log").read_text(errors="replace")[-3000:]
        raise AssertionError(f"{errors[0].stem if errors else f'rank{failed[0]}'} of a {world}-rank launch of {len(jobs)} "
                             f"plans failed: {why}")
    per_rank = [json.loads((folder / f"rank{r}.json").read_text(encoding="utf-8")) for r in range(world)]
    return [[per_rank[r][j] for r in range(world)] for j in range(len(jobs))]


def rank_main(folder_name: str) -> None:
    """One rank of `launch` (a child process)."""
    import traceback
    from datetime import timedelta

    import torch.distributed as dist

    from planner.execute.options import RunOptions
    from planner.execute.train import train_rank
    from planner.plan import plan_from_dict

    folder = Path(folder_name)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(EQUIVALENCE_THREADS)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=120))
    out = []
    for i, job in enumerate(json.loads((folder / "jobs.json").read_text(encoding="utf-8"))):
        plan = plan_from_dict(job["plan"])
        kwargs = {"input_shape": tuple(job["input_shape"])} if job.get("input_shape") else {}
        try:
            rec = train_rank(plan, RunOptions.from_dict(job["options"]), rank, world, torch.device("cpu"), kwargs)
        except BaseException:  # noqa: BLE001 - the test shows which plan failed and why
            (folder / f"rank{rank}.error").write_text(f"plan {i} ({plan.model} {plan.schedule}): {traceback.format_exc()}",
                                                      encoding="utf-8")
            os._exit(1)
        measured = rec.to_dict()
        out.append({k: measured[k] for k in ("losses", "memory", "grad_allreduce_ms", "first_step")})
    (folder / f"rank{rank}.json").write_text(json.dumps(out), encoding="utf-8")
    dist.barrier()
    os._exit(0)  # gloo's threads can abort interpreter teardown (as the worker does)


def run_options(ck: Path, steps: int = 3, lr: float = 1e-2) -> dict:
    """RunOptions (as a dict) of a `launch` job: `steps` steps at `lr`, checkpoints to `ck`."""
    return {"steps": steps, "warmup": 1, "device": "cpu", "lr": lr, "threads": EQUIVALENCE_THREADS, "timeout_s": 120.0,
            "checkpoint_dir": str(ck)}
