"""Executing a plan with torch.distributed.pipelining: launch, stages, measurement, calibration.

Importing this package does not import torch; the modules that train do, when used.
"""

from planner.execute.options import RunOptions

__all__ = ["RunOptions"]
