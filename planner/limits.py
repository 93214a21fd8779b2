"""Physically meaningful ranges for every number a user or a file can give.

A value outside is a typo or a hostile file; left alone it overflows to inf in the simulator
(a bandwidth of 1e-300 B/s) or allocates without bound (10**12 micro-batches). Plans, cluster
and calibration files and the command line's parsers all check against these, so the bounds
live here, below all of them.
"""

from __future__ import annotations

__all__ = [
    "MAX_MEMORY_BYTES", "MIN_BANDWIDTH", "MAX_BANDWIDTH", "MAX_LATENCY_MS",
    "MIN_SPEED", "MAX_SPEED", "MAX_GLOBAL_BATCH", "MAX_SEED",
]

MAX_MEMORY_BYTES = 2**60  # an exbibyte
MIN_BANDWIDTH = 1.0  # bytes/s
MAX_BANDWIDTH = 1e15  # bytes/s, a petabyte per second
MAX_LATENCY_MS = 86_400_000.0  # a day
MIN_SPEED, MAX_SPEED = 1e-6, 1e6  # relative compute speed
MAX_GLOBAL_BATCH = 10**8  # samples per iteration
MAX_SEED = 2**62
