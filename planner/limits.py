"""Physically meaningful ranges for every number a user or a file can give.

A value outside is a typo or a hostile file; left alone it overflows to inf in the simulator
(a bandwidth of 1e-300 B/s) or allocates without bound (10**12 micro-batches). Plans, cluster
and calibration files and the command line's parsers all check against these, so the bounds
live here, below all of them.
"""

from __future__ import annotations

import math

from planner.errors import PplanError

__all__ = [
    "MAX_MEMORY_BYTES", "MIN_BANDWIDTH", "MIN_LINK_BANDWIDTH", "MAX_BANDWIDTH", "MAX_LATENCY_MS",
    "MIN_SPEED", "MAX_SPEED", "MAX_GLOBAL_BATCH", "MAX_SEED", "MAX_MODEL_SPEC_CHARS",
]

MAX_MEMORY_BYTES = 2**60  # an exbibyte
MIN_BANDWIDTH = 1.0  # bytes/s
MIN_LINK_BANDWIDTH = 1e6  # bytes/s a link a user gives may have: below a MB/s it is a unit slip (300 for 300GB/s)
MAX_BANDWIDTH = 1e15  # bytes/s, a petabyte per second
MAX_LATENCY_MS = 86_400_000.0  # a day
MIN_SPEED, MAX_SPEED = 1e-6, 1e6  # relative compute speed
MAX_GLOBAL_BATCH = 10**8  # samples per iteration
MAX_SEED = 2**62
# The longest --model spec, and so the longest model text a profile, plan, run or calibration holds:
# a synthetic spec lists per-layer times, about 16 characters a layer, 64,000 for 4,000 layers.
# One bound for all five, so pplan never writes a file it then refuses to read back.
MAX_MODEL_SPEC_CHARS = 262_144

# Compute actions (stages x micro-batches x 2, or x 3 for a split backward) one simulation may
# have, and one `pplan simulate --sweep` over all its values together. Measured at the bound on
# the 2-core machine (2026-12-01, load ~7): 0.86-0.92 GB peak and 8-9 s of CPU (gpipe and zb, 2 stages).
MAX_SIMULATED_ACTIONS = 1_000_000
# The same when the timeline is recorded (for --json, --out, --timeline or --plot, and the report):
# each action is then boxes to keep, write and draw. At the bound with all four outputs: 0.78-0.84 GB
# and 11 s of CPU (gpipe 32 stages and interleaved 64 stages, every layer recomputed).
MAX_TIMELINE_ACTIONS = 150_000
MAX_SWEEP_VALUES = 100  # values one --sweep lists
MAX_BENCH_LIST = 64  # values one benchmark list option (--layers, --devices, --sizes) gives
__all__ += ["MAX_SIMULATED_ACTIONS", "MAX_TIMELINE_ACTIONS", "MAX_SWEEP_VALUES", "MAX_BENCH_LIST"]
# One `pplan bench planner` cell, layers^2 x devices (its DP tables are layers x layers per device
# kind): the default grid's largest, 1000 x 64. Measured building and solving it (DP): 1000 x 64
# 0.68 GB, 2000 x 16 0.96 GB, 400 x 400 0.81 GB; 4000 x 16 took 3.3 GB and 4000 x 64 over 8 GB.
MAX_BENCH_PLANNER_CELL = 1000 * 1000 * 64
__all__ += ["MAX_BENCH_PLANNER_CELL"]
# What one layer's row of a profile may give, whether read from a CSV (planner.profiling.csvio) or
# built in code and handed to planner.partition.api: beyond these no real device (11 days per layer,
# an exabyte) and the planner's and simulator's sums overflow into inf.
MAX_LAYER_MS = 1e9  # a layer's fwd/bwd/optimizer time and its spread, ms
MAX_LAYER_BYTES = 1e18  # a layer's parameter, activation, output or edge bytes
MAX_LAYER_FLOPS = 1e24  # a layer's floating-point operations
__all__ += ["MAX_LAYER_MS", "MAX_LAYER_BYTES", "MAX_LAYER_FLOPS"]

# The optimizers a plan, a run and a machine file may name, and what each is: not a bound but the
# accepted values of a field, kept here so that every reader of one (down to planner.machine) can
# import them. planner.cost.memory prices each one's state, planner.execute.stages builds each.
OPTIMIZER_MEANINGS = {"adam": "Adam", "adamw": "AdamW", "sgd": "SGD with momentum 0.9", "sgd-plain": "SGD without momentum"}
OPTIMIZERS = tuple(OPTIMIZER_MEANINGS)
__all__ += ["OPTIMIZERS", "OPTIMIZER_MEANINGS"]

# The link between two devices when neither the command line nor a file gives one (a plan's links,
# `pplan partition`'s --bandwidth and --latency and their help): here, beside the range it must lie
# in, so that the command line's help can name it without importing the planner (and numpy).
DEFAULT_BANDWIDTH = 25e9  # bytes/s: a PCIe 4/5-class or NVLink-lite link
DEFAULT_LATENCY_MS = 0.01
__all__ += ["DEFAULT_BANDWIDTH", "DEFAULT_LATENCY_MS"]

DEFAULT_ILP_TIME_LIMIT = 60.0
"""Seconds the ILP may spend over a whole partition search when --time-limit is not given."""
__all__ += ["DEFAULT_ILP_TIME_LIMIT"]


def check_time_limit(seconds: float, flag: str = "--time-limit") -> float:
    """`seconds` when it is a positive, finite number of seconds (an ILP's time limit). PuLP hands
    inf on as `-sec inf`, which CBC rejects ("valid range is -1 to 1.79769e+308") and then solves
    with no limit at all; nan and 0 allow nothing."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not (math.isfinite(seconds) and seconds > 0):
        raise PplanError(f"{flag} must be positive and finite, got {seconds!r}", f"give seconds, e.g. {flag} 60")
    return seconds


__all__ += ["check_time_limit"]


def check_global_batch(global_batch: int) -> None:
    """Refuse a global batch below one sample or above MAX_GLOBAL_BATCH, for the one-pipeline search
    and the data x pipeline x tensor one alike (with --nodes, 10^12 samples was searched, split
    nowhere, and refused as a memory shortfall)."""
    if global_batch < 1:
        raise PplanError(f"--global-batch must be at least 1, got {global_batch}")
    if global_batch > MAX_GLOBAL_BATCH:
        raise PplanError(f"--global-batch {global_batch} is absurdly large (more than {MAX_GLOBAL_BATCH:.0e} samples per iteration)",
                         "give the samples per optimizer step, e.g. --global-batch 512")


__all__ += ["check_global_batch"]
