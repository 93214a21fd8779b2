"""Model FLOPs of one training iteration, and the MFU check. Pure.

Narayanan et al. SC21, eq. 3, for any MLP width f h: GPT with B samples of s tokens, l blocks of
width h, vocabulary V; a block's forward matmuls per token are 2(4 + 2f) h^2 + 4 s h, the head's
2 h V: B s [l (6(4 + 2f) h^2 + 12 s h) + 6 h V], and with full recompute
B s [l (8(4 + 2f) h^2 + 16 s h) + 6 h V]; at f = 4 the paper's 72 B s l h^2 (1 + s/(6h) + V/(12 l h))
and 96 B s l h^2 (1 + s/(6h) + V/(16 l h)).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.cost.precision import TrainingPrecision, profile_dtype, training_precision
from planner.errors import ModelSpecError, PplanError
from planner.models.spec import parse_spec
from planner.profiling.profile import Profile

__all__ = ["gpt_model_flops", "ModelFlops", "model_flops", "checked_mfu", "UNCOUNTED_FLOPS_KEY", "uncounted_flops_layers",
           "uncounted_flops_warning"]

UNCOUNTED_FLOPS_KEY = "flops_uncounted"
"""Profile metadata: the layers (indices, comma-separated) whose FLOPs torch's counter could not
count, which the `flops` column holds as 0 (planner.profiling.flops)."""
_NAMED_AT_MOST = 5  # uncounted layers a line names; the rest are counted


def gpt_model_flops(batch: int, seq: int, layers: int, hidden: int, vocab: int, recompute: bool, ffn: int = 4) -> float:
    """Model FLOPs of one iteration of a GPT over `batch` samples whose MLP is `ffn` x `hidden`
    wide: Narayanan et al. (SC21, eq. 3) for any width (module docstring; ffn = 4 is the paper's)."""
    B, s, l, h, V, f = float(batch), float(seq), float(layers), float(hidden), float(vocab), float(ffn)
    passes = 4.0 if recompute else 3.0  # forward + backward (2 forwards' worth), + the forward again
    block = passes * (2.0 * (4.0 + 2.0 * f) * h * h + 4.0 * s * h)
    return B * s * (l * block + 6.0 * h * V)  # the head is never recomputed: 3 x its 2 h V


@dataclass(frozen=True)
class ModelFlops:
    """Model FLOPs of one iteration over the global batch, counted as Narayanan et al. (2021) do."""

    plain: float
    """Forward + backward (what MFU counts)."""
    recomputed: float
    """Forward + backward + the forward run again under full recompute."""
    tokens_per_sample: int
    """Sequence length of a gpt profile, 1 otherwise."""
    source: str
    """How the FLOPs were counted."""
    dtype: str
    """The profile's dtype, which the model trains in: MFU divides by the hardware's peak in it
    (Hardware.peak_flops_per_s), and its parameters' bytes follow training_precision."""
    uncounted: tuple[str, ...] = ()
    """Layers the FLOPs leave out (torch's counter failed on them): MFU and TFLOP/s are low by their share."""

    @property
    def warning(self) -> str | None:
        """One line for the output that prints MFU or TFLOP/s when the FLOPs leave layers out."""
        if not self.uncounted:
            return None
        return (f"MFU and TFLOP/s leave out the FLOPs of {_layer_list(self.uncounted)}: torch's flop counter failed on "
                "them while profiling, so both are low by those layers' share")

    @property
    def precision(self) -> TrainingPrecision:
        """Bytes per parameter of the model's training state (training_precision of its dtype)."""
        return training_precision(self.dtype)

    def achieved(self, recompute: bool) -> float:
        """The FLOPs that achieved TFLOP/s per GPU counts: recomputed forwards included when recomputing."""
        return self.recomputed if recompute else self.plain


def _gpt_params(profile: Profile) -> dict | None:
    try:
        kind, params = parse_spec(profile.meta.get("model", ""))
    except (ModelSpecError, PplanError):
        return None
    return params if kind == "gpt" else None


def model_flops(profile: Profile, global_batch: int) -> ModelFlops:
    """FLOPs of one iteration of `global_batch` samples: eq. 3 of Narayanan et al. for a gpt
    profile (its MLP width `ffn` included), else 3 x the profile's `flops` column (forward) per sample, else zero (unknown);
    with the profile's dtype (profile_dtype)."""
    dtype = profile_dtype(profile)
    gpt = _gpt_params(profile)
    if gpt is not None:
        args = (global_batch, gpt["seq"], gpt["layers"], gpt["hidden"], gpt["vocab"])
        ffn = int(gpt["ffn"])
        return ModelFlops(gpt_model_flops(*args, False, ffn), gpt_model_flops(*args, True, ffn), int(gpt["seq"]),
                          "Narayanan et al. 2021, eq. 3" + ("" if ffn == 4 else f" for an MLP {ffn} x hidden wide"), dtype)
    if "flops" in profile.present:
        fwd = float(np.sum(profile.columns["flops"][:, 0])) / profile.micro_batch_sizes[0] * global_batch
        uncounted = uncounted_flops_layers(profile)
        left_out = f", leaving out {_layer_list(uncounted)} (torch's flop counter failed on them)" if uncounted else ""
        return ModelFlops(3.0 * fwd, 4.0 * fwd, 1, "profile flops column: 3 x forward (+1 x forward recomputed)" + left_out,
                          dtype, uncounted)
    return ModelFlops(0.0, 0.0, 1, "none (the profile has no flops column)", dtype)


def uncounted_flops_layers(profile: Profile) -> tuple[str, ...]:
    """'layer i (name)' of each layer the profile's metadata says torch's flop counter failed on."""
    listed = profile.meta.get(UNCOUNTED_FLOPS_KEY, "")
    rows = sorted({int(x) for x in listed.split(",") if x.strip().isdigit()})  # metadata.py checks the format
    return tuple(f"layer {i} ({profile.names[i]})" if i < len(profile.names) else f"layer {i}" for i in rows)


def uncounted_flops_warning(profile: Profile) -> str | None:
    """One line for `pplan profile` when the profile it wrote names layers torch's flop counter failed on."""
    uncounted = uncounted_flops_layers(profile)
    if not uncounted:
        return None
    effect = ("MFU and TFLOP/s count a gpt's FLOPs by formula, not from this column" if _gpt_params(profile) is not None
              else "MFU and TFLOP/s computed from it leave them out")
    return (f"torch's flop counter failed on {_layer_list(uncounted)}: their flops are 0 in the profile "
            f"(metadata {UNCOUNTED_FLOPS_KEY}); {effect}")


def _layer_list(layers: tuple[str, ...]) -> str:
    more = len(layers) - _NAMED_AT_MOST
    return ", ".join(layers[:_NAMED_AT_MOST]) + (f" and {more} more" if more > 0 else "")


def checked_mfu(mfu: float, peak_flops_per_s: float, hardware: str) -> float:
    """`mfu` (model FLOPs / (iteration time x GPUs x peak)) when at most 1. Above, each GPU would
    beat `hardware`'s peak: the profile's times and the hardware disagree (a profile made for
    faster hardware, a peak with the wrong unit), so PplanError rather than a plan."""
    if mfu <= 1.0:
        return mfu
    raise PplanError(f"predicted MFU {100 * mfu:.4g}% is above 100%: {mfu * peak_flops_per_s:.4g} FLOP/s of model FLOPs per GPU "
                     f"against the {peak_flops_per_s:.4g} FLOP/s peak of {hardware}",
                     "the profile's times are faster than this hardware: plan with the hardware the profile was made on, "
                     "or give the device's real peak in FLOP/s (e.g. 9.89e14)")
