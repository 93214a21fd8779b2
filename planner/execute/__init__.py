"""Executing a plan with torch.distributed.pipelining: launch, stages, measurement, calibration.

    from planner.execute import RunOptions, run_plan
    outcome = run_plan(load_plan("plan.json"), RunOptions(steps=10), plan_path="plan.json")

Importing this package does not import torch (the ranks do); docs/executor.md has the details.
Your own training loop: `planner.execute.pipeline.build_pipeline` (also `from planner import
build_pipeline`), the function the ranks of `pplan run` call.
"""

from planner.execute.options import RunOptions
from planner.execute.run import RunOutcome, run_plan

__all__ = ["RunOptions", "RunOutcome", "run_plan"]
