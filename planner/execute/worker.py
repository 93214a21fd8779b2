"""The process of one rank: `python -m planner.execute.worker CONFIG.json`, or in-process under torchrun.

It reads torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT), joins the process group (gloo on CPU, NCCL on CUDA, with the run's timeout), trains
its stages and sends what it measured (a RankMeasurement, pickled by torch's gather_object) to
rank 0, which returns the list of all ranks' measurements; started by the local launcher, rank 0
writes that list to `<run_dir>/result.json` (RankMeasurement.to_dict) for the launcher to read.
A failure is written to `<run_dir>/rank<r>.error.json` (one line, for the launcher's message)
and the process exits non-zero: 2 for a user error (PplanError), 1 otherwise.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from planner.errors import PplanError, RunError
from planner.execute.options import RunOptions
from planner.hostinfo import process_stat
from planner.plan import plan_from_dict
from planner.warm_start import PARENT_ENV

if TYPE_CHECKING:
    from planner.execute.measurement import RankMeasurement

__all__ = ["Env", "read_env", "run_worker", "rank_entry", "main"]


class Env:
    """This process's place in the job, from torchrun-style environment variables."""

    def __init__(self, rank: int, world: int, local_rank: int, local_world: int):
        self.rank, self.world, self.local_rank, self.local_world = rank, world, local_rank, local_world


_JOB_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def read_env() -> Env | None:
    """The job position, or None when not started by torchrun or the launcher.

    A job is RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT together (torchrun sets all four).
    Neither RANK nor WORLD_SIZE: a plain local run. Some but not all, or values that cannot be a job
    (RANK outside 0..WORLD_SIZE-1), are refused with one line: a stray RANK or WORLD_SIZE left
    in a shell would otherwise make `pplan run` wait for peers that never come.
    """
    present = [v for v in _JOB_VARS if os.environ.get(v, "") != ""]
    if "RANK" not in present and "WORLD_SIZE" not in present:
        return None  # MASTER_ADDR/MASTER_PORT alone are harmless leftovers: a local run
    shown = ", ".join(f"{v}={os.environ[v]!r}" for v in present)
    hint = f"unset {' '.join(present)} for a local run, or start under torchrun (which sets {', '.join(_JOB_VARS)})"
    missing = [v for v in _JOB_VARS if v not in present]
    if missing:
        raise PplanError(f"the environment has {shown} but not {', '.join(missing)}: neither a local run nor a torchrun job",
                       hint)
    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        port = int(os.environ["MASTER_PORT"])
    except ValueError:
        raise PplanError(f"RANK / WORLD_SIZE / LOCAL_RANK / MASTER_PORT are not all integers ({shown})", hint) from None
    if world < 1 or not 0 <= rank < world or not 0 <= local_rank < max(1, local_world) or not 0 < port < 65536:
        raise PplanError(f"the environment's job is impossible ({shown}): RANK must be in 0..WORLD_SIZE-1 and "
                       "MASTER_PORT a TCP port", hint)
    return Env(rank, world, local_rank, local_world)


def run_worker(cfg: dict[str, Any], env: Env) -> list[RankMeasurement] | None:
    """Train this rank; rank 0 returns every rank's measurement, the others None."""
    import torch
    import torch.distributed as dist

    from planner.hostinfo import usable_cores
    from planner.execute.job_agreement import agree_on_job
    from planner.execute.job_watch import report_failure
    from planner.execute.train import train_rank

    plan = plan_from_dict(cfg["plan"])
    opts = RunOptions.from_dict(cfg["options"])
    from planner.execute.mesh import world_text

    if env.world != plan.n_processes:
        raise RunError(f"the job has {env.world} processes but the plan needs {plan.n_processes} "
                       f"({world_text(plan)})",
                       f"start {plan.n_processes} processes in total (torchrun --nnodes x --nproc-per-node)")
    torch.set_num_threads(opts.threads or max(1, usable_cores() // max(1, env.local_world)))
    use_cuda = cfg.get("device_type") == "cuda"
    if use_cuda:
        if env.local_rank >= torch.cuda.device_count():
            raise RunError(f"local rank {env.local_rank} has no GPU (this machine sees {torch.cuda.device_count()})",
                           "start at most one process per GPU on each machine")
        device = torch.device("cuda", env.local_rank)
        torch.cuda.set_device(device)
        _join("nccl", env, opts.timeout_s, device_id=device)
    else:
        device = torch.device("cpu")
        _join("gloo", env, opts.timeout_s)
    try:
        agree_on_job(cfg, env.rank, env.world)  # a node given another plan or --steps: every rank refuses
        model_kwargs = dict(cfg.get("model_kwargs") or {})
        if "input_shape" in model_kwargs:  # JSON turned the tuple into a list
            model_kwargs["input_shape"] = tuple(model_kwargs["input_shape"])
        measured = train_rank(plan, opts, env.rank, env.world, device, model_kwargs, resume=cfg.get("resume"))
        gathered: list[Any] | None = [None] * env.world if env.rank == 0 else None
        # gather_object needs a device the backend can move objects through
        dist.gather_object(measured, gathered, dst=0)
        dist.barrier()  # nobody tears down its connections while a peer still talks to it
        return gathered if env.rank == 0 else None
    except BaseException as e:
        report_failure(e)  # under torchrun: the reason is posted before the peers see our connections close
        raise
    finally:
        dist.destroy_process_group()


def _join(backend: str, env: Env, timeout_s: float, **kw: Any) -> None:
    """init_process_group, with a failure to reach the job as one line (RunError)."""
    import torch.distributed as dist

    try:
        dist.init_process_group(backend, rank=env.rank, world_size=env.world, timeout=timedelta(seconds=timeout_s), **kw)
    except Exception as e:  # noqa: BLE001 - torch raises DistNetworkError, ValueError, RuntimeError...
        text = " ".join(str(e).split())[:300]
        where = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
        raise RunError(f"rank {env.rank} could not join the {env.world}-process job at {where} ({backend}): "
                       f"{type(e).__name__}: {text}", _join_hint(text, timeout_s, where)) from None


def _join_hint(text: str, timeout_s: float, where: str) -> str:
    """What to do about a failed join: a peer that never came within the timeout is not the same
    fix as the job's store going away (its node ended the job: the reason is in that node's output)."""
    low = text.lower()
    if "timeout" in low or "timed out" in low:
        return (f"some rank did not join within --timeout {timeout_s:g} s: read the other nodes' output (a node "
                f"may have refused its command), start every node's torchrun, check that each reaches {where}; "
                "raise --timeout only for a node that starts later than that")
    if "closed" in low or "refused" in low or "reset" in low or "got 0 bytes" in low:
        return (f"the job's store at {where} went away: the node that keeps it (torchrun's node rank 0) ended the "
                "job, and its output says why; or no torchrun was started there")
    return "start every rank (torchrun), check MASTER_ADDR/MASTER_PORT, or raise --timeout"


def _watch_parent(parent: int, run_dir: str | None = None) -> None:
    """Exit if the launcher dies (no rank outlives `pplan run`), removing its run folder
    (a launcher killed by SIGKILL cannot remove it itself). The launcher is this process's parent
    or, for a rank forked by the warm-start server, its grandparent: so where /proc exists it is
    watched by its start time (a pid reused by another process does not count as alive)."""
    born = _start_time(parent)
    if born is not None:
        def alive() -> bool:
            return _start_time(parent) == born
    else:  # no /proc: only a direct child of the launcher can tell
        def alive() -> bool:
            return os.getppid() == parent

    def loop() -> None:
        while True:
            if not alive():
                if run_dir and Path(run_dir).name.startswith("pplan-run-"):
                    shutil.rmtree(run_dir, ignore_errors=True)
                os._exit(1)
            time.sleep(0.5)

    threading.Thread(target=loop, daemon=True, name="pplan-parent-watch").start()


def _start_time(pid: int) -> str | None:
    """When process `pid` started (from /proc), or None if it is gone, a zombie, or /proc is absent."""
    fields = process_stat(pid)
    return None if len(fields) < 20 or fields[0] in ("Z", "X") else fields[19]


def _write_error(run_dir: str | None, rank: int, kind: str, message: str, code: int) -> None:
    if not run_dir:
        return
    try:
        path = Path(run_dir) / f"rank{rank}.error.json"
        path.write_text(json.dumps({"kind": kind, "message": message, "exit_code": code}), encoding="utf-8")
    except OSError:
        pass


def rank_entry(cfg_path: str) -> int:
    """Entry of a rank the local launcher started (forked warm or a fresh process)."""
    return main([cfg_path])


def main(argv: list[str] | None = None) -> int:
    """Entry of a rank started by the local launcher."""
    argv = sys.argv[1:] if argv is None else argv
    cfg = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    if os.environ.get(PARENT_ENV):
        _watch_parent(int(os.environ[PARENT_ENV]), cfg.get("run_dir"))
    env = read_env()
    rank = env.rank if env else -1
    run_dir = cfg.get("run_dir")
    try:
        if env is None:
            raise RunError("worker started without RANK / WORLD_SIZE", "use `pplan run`")
        result = run_worker(cfg, env)
        if result is not None and run_dir:
            tmp = Path(run_dir) / "result.json.tmp"
            # non-finite losses stay (NaN, Infinity): the launcher finds the divergence from them
            tmp.write_text(json.dumps([m.to_dict() for m in result]), encoding="utf-8")
            os.replace(tmp, Path(run_dir) / "result.json")
        return 0
    except PplanError as e:
        _write_error(run_dir, rank, type(e).__name__, e.one_line(), 2)
        sys.stderr.write(f"pplan: rank {rank}: error: {e.one_line()}\n")
        return 2
    except BaseException as e:  # noqa: BLE001 - report anything, with the cause, then exit non-zero
        message = " ".join(f"{type(e).__name__}: {e}".split())[:500]
        _write_error(run_dir, rank, type(e).__name__, message, 1)
        sys.stderr.write(f"pplan: rank {rank}: {traceback.format_exc()}")
        return 1


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter finalization: gloo's C++ threads can abort the process (SIGABRT,
    # "terminate called without an active exception") while Python tears down, after the
    # rank's work is complete and its result is on disk.
    os._exit(code)
