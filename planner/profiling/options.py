"""What a profile is asked to measure (`pplan profile`'s settings), checked when it is made.

torch-free on purpose: `pplan profile` builds ProfileOptions before importing torch, so a
mistyped --dtype or --timer fails in a fraction of a second rather than after torch's import
(seconds on a small machine); planner.profiling.profiler builds the same record, so a
library caller gets the same checks and the same messages.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from planner.errors import PplanError
from planner.hardware import DTYPE_BYTES
from planner.hostinfo import usable_cores
from planner.limits import MAX_SEED
from planner.models.spec import INPUT_DTYPES

__all__ = ["DTYPE_NAMES", "TIMER_NAMES", "ProfileOptions", "MAX_REPEATS", "THREADS_PER_CORE", "check_threads"]

DTYPE_NAMES = tuple(DTYPE_BYTES)
"""Parameter and float-input dtypes a profile can be measured in (torch dtype names; planner.hardware's)."""
TIMER_NAMES = ("sched", "wall")
"""sched: wall time minus time spent waiting for a CPU; wall: plain wall time."""
_DEVICE = re.compile(r"cpu|cuda(:\d+)?")
# Timed (and untimed) runs per layer and size: 15 already keeps two runs of millisecond layers within ~20%; ten
# thousand is far past any use, and `--repeats 1e20` would measure practically forever.
MAX_REPEATS = 10_000
# torch threads a process may ask for, per usable core. Beyond a few per core threads only
# contend for the cores; far beyond, the OpenMP pool cannot be created (100,000 threads killed
# `pplan profile` with signal 11 and no message, and `pplan run` failed after seconds with an
# unrelated gloo hint).
THREADS_PER_CORE = 4


def check_threads(threads: int, flag: str = "--threads", *, zero: str | None = None) -> None:
    """Refuse a torch thread count below 1 (below 0 where `zero`, the hint, says what 0 asks for) or
    above THREADS_PER_CORE x the cores this process may run on: its CPU affinity
    (planner.hostinfo.usable_cores), not the host's count, which a container or taskset narrows."""
    if threads < (0 if zero else 1):
        raise PplanError(f"{flag} {threads} must be {'0 or more' if zero else 'at least 1'}",
                         zero or "1 gives the steadiest timings")
    cores = usable_cores()
    most = THREADS_PER_CORE * cores
    if threads > most:
        raise PplanError(f"{flag} {threads} is more than {most}, {THREADS_PER_CORE} per core for the {cores} core(s) "
                         "this process may run on (its CPU affinity)",
                         f"give at most {most}: more threads only contend for the cores; 1 gives the steadiest timings")


@dataclass(frozen=True)
class ProfileOptions:
    """How to measure a model's layers; the model spec says what to measure."""

    micro_batch_sizes: tuple[int, ...]
    """Micro-batch sizes to measure, ascending and distinct."""
    device: str = "cpu"
    """cpu, cuda or cuda:N."""
    dtype: str = "float32"
    """One of DTYPE_NAMES."""
    warmup: int = 3
    """Untimed runs before measuring."""
    repeats: int = 15
    """Timed runs; the median is recorded."""
    seed: int = 0
    """Seed of the weights and the batch."""
    threads: int | None = 1
    """torch CPU threads while measuring (None: the process's setting)."""
    timer: str = "sched"
    """One of TIMER_NAMES."""
    co_run: int = 0
    """Background processes training the same model while measuring (planner.profiling.corun)."""
    input_shape: tuple[int, ...] | None = None
    """A factory model's input, one sample."""
    input_dtype: str = "float"
    """A factory model's input: float or long."""
    vocab: int | None = None
    """Token ids below this for long inputs."""

    def __post_init__(self) -> None:
        sizes = self.micro_batch_sizes
        if not sizes or any(not isinstance(s, int) or s < 1 for s in sizes) or len(set(sizes)) != len(sizes):
            raise PplanError(f"micro-batch sizes {list(sizes)} must be distinct positive integers", "e.g. 1,2,4,8")
        object.__setattr__(self, "micro_batch_sizes", tuple(sorted(sizes)))
        if not _DEVICE.fullmatch(self.device):
            raise PplanError(f"--device {self.device!r} is not supported", "use cpu, cuda or cuda:N")
        if self.dtype not in DTYPE_NAMES:
            raise PplanError(f"--dtype {self.dtype!r} is not supported", f"use one of {', '.join(DTYPE_NAMES)}")
        if self.timer not in TIMER_NAMES:
            raise PplanError(f"--timer {self.timer!r} is not supported", f"use {' or '.join(TIMER_NAMES)}")
        if not (0 <= self.warmup <= MAX_REPEATS and 1 <= self.repeats <= MAX_REPEATS):
            raise PplanError(f"--warmup {self.warmup} / --repeats {self.repeats}: need 0 <= warmup <= {MAX_REPEATS} "
                             f"and 1 <= repeats <= {MAX_REPEATS}", "e.g. --warmup 3 --repeats 15")
        if self.threads is not None:
            check_threads(self.threads)
        if self.input_dtype not in INPUT_DTYPES:
            raise PplanError(f"--input-dtype {self.input_dtype!r} is not supported", f"use {' or '.join(INPUT_DTYPES)}")
        if self.vocab is not None and self.vocab < 2:
            raise PplanError(f"--vocab {self.vocab} must be at least 2", "give the token ids' upper bound, e.g. --vocab 32000")
        if not 0 <= self.seed <= MAX_SEED:  # the bound plans and profile headers hold too
            raise PplanError(f"--seed {self.seed} is out of range (0 to {MAX_SEED})", "e.g. --seed 0")
