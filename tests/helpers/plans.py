"""Synthetic profiles (exact, not measured: the costs a `synthetic:` model is built to have) and plans written by hand."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any


def synthetic_spec(layers: int, fwd_ms: float = 10.0, bwd_ms: float = 20.0, param_bytes: int = 4096,
                   act_bytes: int = 1000, hidden: int = 16) -> str:
    return f"synthetic:layers={layers},fwd_ms={fwd_ms:g},bwd_ms={bwd_ms:g},param_bytes={param_bytes},act_bytes={act_bytes},hidden={hidden}"


def write_synthetic_profile(path: Path, layers: int, micro_batch_size: int, fwd_ms: float = 10.0, bwd_ms: float = 20.0,
                            param_bytes: int = 4096, act_bytes: int = 1000, hidden: int = 16) -> str:
    """The profile a synthetic model is built to have (exact, not measured); returns its spec."""
    spec = synthetic_spec(layers, fwd_ms, bwd_ms, param_bytes, act_bytes, hidden)
    b = micro_batch_size
    rows = ["# format: pplan-profile/1", f"# model: {spec}", f"# input_bytes_per_sample: {4 * hidden}",
            "layer,name,micro_batch_size,fwd_ms,bwd_ms,param_bytes,activation_bytes,output_bytes,bwd_input_ms,bwd_weight_ms,optimizer_ms"]
    for i in range(layers):
        # the first layer's input needs no gradient: its whole backward is the weight part
        bi, bw = (0.0, bwd_ms) if i == 0 else (bwd_ms / 2, bwd_ms / 2)
        rows.append(f"{i},layer{i},{b},{fwd_ms},{bwd_ms},{param_bytes},{act_bytes * b},{4 * hidden * b},{bi},{bw},0")
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return spec


def write_plan(path: Path, model: str, schedule: str, devices: int, cuts: list[tuple[int, int]],
               micro_batch_size: int = 2, n_microbatches: int = 4, recompute: dict[int, list[int]] | None = None,
               optimizer: str = "adam", profile: Path | None = None, seed: int = 0) -> Path:
    plan: dict[str, Any] = {
        "model": model, "seed": seed, "schedule": schedule, "micro_batch_size": micro_batch_size,
        "n_microbatches": n_microbatches, "devices": devices, "optimizer": optimizer,
        "stages": [{"device": s % devices, "layers": list(c), "recompute": (recompute or {}).get(s, [])}
                   for s, c in enumerate(cuts)],
    }
    if profile is not None:
        plan["profile"] = {"path": str(profile), "sha256": hashlib.sha256(profile.read_bytes()).hexdigest()}
    path.write_text(json.dumps(plan, indent=1), encoding="utf-8")
    return path
