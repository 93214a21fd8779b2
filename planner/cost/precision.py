"""Training precision of a profile's model: bytes per parameter of weights, gradients and Adam state. Pure.

A 16-bit profile (bfloat16, float16) trains in mixed precision with Adam: 2 weights + 2 gradients
+ 12 fp32 master weights, momentum and variance = 16 bytes per parameter; a float32 profile trains
in pure fp32 Adam, 4 + 4 + 8 (no master copy), also 16. A profile's param_bytes divide by its
element size to give parameters (`profile_precision`: the one place that happens).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from planner.errors import PplanError
from planner.profiling.profile import Profile

__all__ = ["TrainingPrecision", "MIXED_BF16", "PURE_FP32", "DEFAULT_DTYPE", "training_precision", "profile_dtype",
           "profile_precision"]


@dataclass(frozen=True)
class TrainingPrecision:
    """How a profile's model trains: bytes per parameter of each part of its static state."""

    dtype: str
    """The profile's dtype (its `# dtype` header)."""
    element_bytes: float
    """Bytes per parameter in the profile's param_bytes (what its weights are stored in)."""
    weight_bytes: float
    """Weights the forward and backward compute with, per parameter."""
    grad_bytes: float
    """Gradients per parameter (what the data-parallel sync moves)."""
    optimizer_bytes: float
    """Adam's state per parameter: fp32 momentum and variance, plus an fp32 master copy of 16-bit weights."""

    @property
    def bytes_per_param(self) -> float:
        """Weights + gradients + optimizer state per parameter, unsharded."""
        return self.weight_bytes + self.grad_bytes + self.optimizer_bytes

    @property
    def adam_step_bytes(self) -> float:
        """Memory traffic of one fused Adam step per parameter: the gradient read, the fp32 state read
        and written, and (mixed precision) the 16-bit weights written from the master copy. fp32's state
        is its weights and two moments (4 + 4 + 8 read and written, + 4 = 28 bytes); mixed precision's
        the master copy and two moments (2 x 12, + 2 + 2 = 28): the same traffic, not one in proportion
        to the 16-bit weights."""
        master_copy = self.weight_bytes < 4.0  # 16-bit weights: optimizer_bytes holds their fp32 master
        fp32_state = self.optimizer_bytes + (0.0 if master_copy else self.weight_bytes)
        return self.grad_bytes + 2.0 * fp32_state + (self.weight_bytes if master_copy else 0.0)


MIXED_BF16 = TrainingPrecision("bfloat16", 2.0, 2.0, 2.0, 12.0)
"""bf16 weights and gradients, fp32 master weights, momentum and variance: 16 bytes per parameter."""
PURE_FP32 = TrainingPrecision("float32", 4.0, 4.0, 4.0, 8.0)
"""fp32 weights, gradients, momentum and variance (no master copy): 16 bytes per parameter."""
DEFAULT_DTYPE = "bfloat16"
"""The dtype of a profile without a `# dtype` line (hand-written): the cluster model's 16-bit default."""


def training_precision(dtype: str) -> TrainingPrecision:
    """The precision a model profiled in `dtype` trains in (module docstring)."""
    if dtype in ("bfloat16", "float16"):
        return replace(MIXED_BF16, dtype=dtype)
    if dtype == "float32":
        return PURE_FP32
    raise PplanError(f"profile dtype {str(dtype)[:40]!r} has no training precision in the cluster model",
                     "profile in float32, bfloat16 or float16 (the profile's `# dtype:` line)")


def profile_dtype(profile: Profile) -> str:
    """The dtype a profile was measured or computed in (DEFAULT_DTYPE when its header has none)."""
    dtype = str(profile.meta.get("dtype") or DEFAULT_DTYPE)
    training_precision(dtype)  # refuse a dtype the model cannot price, naming it
    return dtype


def profile_precision(profile: Profile) -> TrainingPrecision:
    """The training precision of a profile's model: the one place its param_bytes become parameters."""
    return training_precision(profile_dtype(profile))
