"""Options of one execution of a plan (what `pplan run` was asked to do)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from planner.errors import PplanError

__all__ = ["RunOptions"]


@dataclass(frozen=True)
class RunOptions:
    """How to run a plan; the plan itself says what to run."""

    steps: int = 10
    """Optimizer steps to reach (a resumed run continues up to this count)."""
    warmup: int = 2
    """Steps excluded from the timing (the first ones: shape inference, allocator warm-up)."""
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
        if self.warmup < 0:
            raise PplanError(f"--warmup {self.warmup} must be 0 or more")
        if not self.lr > 0:
            raise PplanError(f"--lr {self.lr} must be positive")
        if self.device not in ("cpu", "cuda", "auto"):
            raise PplanError(f"--device {self.device!r} is unknown", "use cpu, cuda or auto")
        if not self.timeout_s > 0:
            raise PplanError(f"--timeout {self.timeout_s} must be positive")
        if self.checkpoint_every < 0:
            raise PplanError(f"--checkpoint-every {self.checkpoint_every} must be 0 or more")
        if self.checkpoint_every and not self.checkpoint_dir:
            raise PplanError("--checkpoint-every needs --checkpoint-dir")
        if self.threads < 0:
            raise PplanError(f"--threads {self.threads} must be 0 or more")
        if self.input_shape is not None:
            object.__setattr__(self, "input_shape", tuple(int(d) for d in self.input_shape))  # JSON gives a list
            if not self.input_shape or any(d < 1 for d in self.input_shape):
                raise PplanError(f"--input-shape {self.input_shape} needs positive dimensions", "e.g. 3,32,32")
        if self.input_dtype not in (None, "float", "long"):
            raise PplanError(f"--input-dtype {self.input_dtype!r} must be float or long")
        if self.vocab is not None and self.vocab < 2:
            raise PplanError(f"--vocab {self.vocab} must be at least 2")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RunOptions":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})
