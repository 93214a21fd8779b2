"""What the measured benches share: profile a model, plan it, turn candidates into plans, run one.

Every measured bench goes through the same steps a user takes: `profile_model` writes a
profile, `partition` plans it, and `run_plan` (the executor behind `pplan run`) trains the plan
for a few steps and returns the run JSON with the prediction made from that profile. Files go
to a temporary folder per bench run (nothing is reused from an earlier run).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from planner.errors import PplanError
from planner.plan import SearchRecord

if TYPE_CHECKING:
    from planner.execute.runrecord import RunRecord

__all__ = ["profile_to", "candidate_plan", "run_measured"]


def profile_to(spec: str, sizes: list[int], work_dir: Path, progress: Callable[[str], None],
               device: str = "cpu", input_shape: tuple[int, ...] | None = None, warmup: int = 1, repeats: int = 3,
               threads: int = 1, co_run: int = 0):
    """Profile `spec` at `sizes` into work_dir (once per spec, sizes and input) and load it back.
    The few default repeats suit benches that compare plans; one that compares predicted with
    measured times profiles as `pplan profile` does (warmup 3, repeats 15). `threads`: what each
    rank of the runs will have (the executor gives cores // ranks, at least 1). `co_run`: processes
    training the model beside the profiler, the runs' other ranks (planner.profiling.corun)."""
    from planner.profiling.profile import load_profile, write_profile

    key = hashlib.sha256(f"{spec}|{sizes}|{device}|{input_shape}|{warmup}|{repeats}|{threads}|{co_run}".encode()).hexdigest()[:12]
    path = work_dir / f"profile-{key}.csv"
    if not path.exists():
        from planner.profiling.profiler import profile_model

        beside = f" beside {co_run} co-running process(es)" if co_run else ""
        progress(f"profiling {spec} at micro-batch sizes {','.join(map(str, sizes))}{beside}")
        prof = profile_model(spec, sizes, device=device, warmup=warmup, repeats=repeats, input_shape=input_shape,
                             threads=threads, co_run=co_run)
        write_profile(prof, path)
    return load_profile(path)


def candidate_plan(plan: Any, cand: Any) -> Any:
    """The plan a search candidate stands for (a baseline's cuts at its own schedule and M)."""
    return plan.with_(schedule=cand.point.schedule, micro_batch_size=cand.point.micro_batch_size,
                      n_microbatches=cand.point.n_microbatches, stages=cand.stages, devices=cand.layout.devices,
                      predicted=cand.sim.prediction() if cand.sim is not None else None,
                      search=SearchRecord(method=cand.method, source="pplan bench"))


def run_measured(plan: Any, work_dir: Path, name: str, *, steps: int, warmup: int, device: str = "cpu",
                 timeout_s: float = 300.0, calibrate: bool = False) -> RunRecord | str:
    """Run `plan` with the executor: the run's record, or one line saying why it failed.
    `calibrate`: as `pplan run --calibrate`, fit a calibration from this run and write it beside
    the plan's profile, where later runs of plans on that profile predict with it."""
    from planner.execute.options import RunOptions
    from planner.execute.run import run_plan
    from planner.plan import write_plan

    plan_path = work_dir / f"{name}.json"
    write_plan(plan, plan_path)
    opts = RunOptions(steps=steps, warmup=warmup, device=device, timeout_s=timeout_s, calibrate=calibrate)
    try:
        outcome = run_plan(plan, opts, plan_path=str(plan_path))
    except PplanError as e:  # one failed run is a row of the table, not the end of the bench
        return e.one_line()
    return outcome.record if outcome is not None else "no result on this rank"
