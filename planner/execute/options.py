"""Options of one execution of a plan (what `pplan run` was asked to do)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from planner.errors import PplanError
from planner.profiling.options import check_threads

__all__ = ["RunOptions", "MAX_STEPS", "DEFAULT_WARMUP", "MAX_TIMEOUT_S"]

# A measuring run, not a training job: ten million steps of even 10 ms is more than a day; a
# larger count is a typo (`--steps 1e20` would run practically forever).
MAX_STEPS = 10_000_000
DEFAULT_WARMUP = 2
"""Warm-up steps when none are given (fewer when the run has fewer steps: one is always measured)."""
# Longer than any wait for a peer can sensibly be; torch's process-group timeout is a timedelta,
# which an infinite or astronomically long timeout overflows.
MAX_TIMEOUT_S = 7 * 86_400.0


@dataclass(frozen=True)
class RunOptions:
    """How to run a plan; the plan itself says what to run."""

    steps: int = 10
    """Optimizer steps to reach (a resumed run continues up to this count)."""
    warmup: int | None = None
    """Steps excluded from the timing (the first ones: shape inference, allocator warm-up); fewer
    than `steps`. None: DEFAULT_WARMUP, or steps - 1 when that is fewer (an int after construction)."""
    lr: float = 1e-3
    """Learning rate of the plan's optimizer."""
    device: str = "auto"
    """cpu, cuda or auto (cuda when available and the plan fits the visible GPUs)."""
    timeout_s: float = 300.0
    """Process-group timeout: a rank waiting longer than this for a peer fails."""
    checkpoint_dir: str | None = None
    """Where to save (and resume from) stage weights and optimizer state."""
    checkpoint_every: int = 0
    """Also save every K steps (0 = only at the end)."""
    calibrate: bool = False
    """Measure send/recv latency and bandwidth between ranks (for calibration)."""
    track_memory: bool = True
    """Track saved activations in one warm-up step (CPU memory measure)."""
    threads: int = 0
    """torch threads per rank (0 = cores // local ranks, at least 1)."""
    prefer_torch: bool = True
    """Run gpipe/1f1b/interleaved on torch's schedule classes when they equal the plan's order."""
    verbose: bool = False
    """Forward every line the ranks print (torch warnings included)."""
    input_shape: tuple[int, ...] | None = None
    """A factory model's input, one sample (--input-shape); default: the profile's record."""
    input_dtype: str | None = None
    """float or long (--input-dtype); default: the profile's record."""
    vocab: int | None = None
    """Token ids below this for long inputs (--vocab); default: the profile's record."""

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise PplanError(f"--steps {self.steps} must be at least 1")
        if self.steps > MAX_STEPS:
            raise PplanError(f"--steps {self.steps} is more than {MAX_STEPS:,} (a measuring run, not a training job)",
                             "e.g. --steps 10")
        if self.warmup is None:
            object.__setattr__(self, "warmup", min(DEFAULT_WARMUP, self.steps - 1))
        if self.warmup < 0:
            raise PplanError(f"--warmup {self.warmup} must be 0 or more")
        if self.warmup >= self.steps:  # else a warm-up step would be measured as the run's time
            raise PplanError(f"--warmup {self.warmup} leaves none of --steps {self.steps} to measure",
                             f"give --steps more than --warmup, e.g. --steps {self.warmup + 3} --warmup {self.warmup}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise PplanError(f"--lr {self.lr} must be a positive finite number", "e.g. --lr 1e-3")
        if self.device not in ("cpu", "cuda", "auto"):
            raise PplanError(f"--device {self.device!r} is unknown", "use cpu, cuda or auto")
        if not 0 < self.timeout_s <= MAX_TIMEOUT_S:  # NaN fails both
            raise PplanError(f"--timeout {self.timeout_s} must be positive and at most {MAX_TIMEOUT_S:g} s (a week)",
                             "e.g. --timeout 300")
        if self.checkpoint_every < 0:
            raise PplanError(f"--checkpoint-every {self.checkpoint_every} must be 0 or more")
        if self.checkpoint_every and not self.checkpoint_dir:
            raise PplanError("--checkpoint-every needs --checkpoint-dir")
        check_threads(self.threads, zero="0: cores / ranks")
        if self.input_shape is not None:
            object.__setattr__(self, "input_shape", tuple(int(d) for d in self.input_shape))  # JSON gives a list
            if not self.input_shape or any(d < 1 for d in self.input_shape):
                raise PplanError(f"--input-shape {self.input_shape} needs positive dimensions", "e.g. 3,32,32")
        if self.input_dtype not in (None, "float", "long"):
            raise PplanError(f"--input-dtype {self.input_dtype!r} must be float or long")
        if self.vocab is not None and self.vocab < 2:
            raise PplanError(f"--vocab {self.vocab} must be at least 2")

    def check_resume(self, step: int, save: str) -> None:
        """Refuse to resume at `step` (from the save named `save`) when this run could not time a
        steady step. A resumed run is fresh processes: it warms up again (shape inference, the
        allocator, thread pools), so the steps it trains, --steps minus the save's step, must
        outnumber --warmup, as --steps must for a fresh run; else a warm-up step would stand for
        the run's time and memory."""
        if step >= self.steps:
            raise PplanError(f"checkpoint {save} is already at step {step} >= --steps {self.steps}",
                             f"pass --steps {step + self.steps} to train further")
        left = self.steps - step
        if left <= self.warmup:
            raise PplanError(f"checkpoint {save} is at step {step}: --steps {self.steps} leaves {left} step(s) to "
                             f"train, none after --warmup {self.warmup} to measure (a resumed run warms up again)",
                             f"pass --steps {step + self.warmup + 1} or more")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RunOptions":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})
