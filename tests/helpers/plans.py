"""Synthetic profiles (exact, not measured: the costs a `synthetic:` model is built to have), plans written by hand,
the check that a pipelined run equals the one-process run, and many small plans run in one launch."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

_REPO = Path(__file__).resolve().parents[2]


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


def assert_trains_alike(losses: list[float], got: dict, ref_losses: list[float], ref: dict, loss_rel: float, atol: float) -> None:
    """Same losses (relative `loss_rel`), the same layers with the same parameters and buffers
    (BatchNorm statistics), each within `atol`; and training moved the weights."""
    import pytest
    import torch

    assert losses == pytest.approx(ref_losses, rel=loss_rel, abs=0), f"losses {losses}, one process {ref_losses}"
    assert ref_losses[-1] != ref_losses[0], f"training did not move the loss: {ref_losses}"
    assert sorted(got) == sorted(ref), f"layers {sorted(got)}, one process {sorted(ref)}"
    for i, sd in ref.items():
        assert sorted(got[i]) == sorted(sd), f"layer {i}: {sorted(got[i])}, one process {sorted(sd)}"
        for name, want in sd.items():
            torch.testing.assert_close(got[i][name], want, rtol=0, atol=atol, msg=lambda m, i=i, n=name: f"layer {i} {n}: {m}")


def run_plans_in_one_launch(plans: list[Any], input_shapes: list[tuple[int, ...] | None], folder: Path,
                            steps: int = 3, lr: float = 1e-2, timeout_s: float = 600.0) -> list[list[float]]:
    """Train each plan (all with the same number of ranks) for `steps` steps, as `pplan run`'s
    ranks do (planner.execute.train.train_rank: stages, schedule, tied-weight sums, checkpoint),
    but one plan after the other in the same processes and process group: starting a rank and
    importing torch (and transformers) costs seconds, a tiny plan's three steps a fraction of one.
    Plan i's final weights are checkpointed in `folder/ck<i>`. Returns each plan's losses;
    raises AssertionError naming the plan and the rank's error when a rank fails."""
    from planner.plan import plan_to_dict

    from helpers.meshruns import launch, run_options

    world = plans[0].n_devices
    if any(p.n_devices != world for p in plans):
        raise ValueError("every plan of one launch needs the same number of ranks")
    jobs = [{"plan": plan_to_dict(p), "input_shape": list(s) if s else None,
             "options": run_options(folder / f"ck{i}", steps=steps, lr=lr)}
            for i, (p, s) in enumerate(zip(plans, input_shapes))]
    records = launch(jobs, world, folder, timeout_s)
    # the last stage's rank has the losses
    return [[per_rank[world - 1]["losses"][str(k)] for k in range(steps)] for per_rank in records]


def three_layer_profile(extra: dict[str, list[int]] | None = None, meta: dict[str, str] | None = None) -> Any:
    """A Profile of layers a, b, c measured at micro-batch size 4: 1 ms forward, 2 ms backward, no
    parameters, 1000 activation and 100 output bytes each, plus `extra` columns (a value per layer)."""
    import numpy as np

    from planner.profiling.profile import make_profile

    cols = {"fwd_ms": np.ones((3, 1)), "bwd_ms": np.full((3, 1), 2.0), "param_bytes": np.zeros((3, 1)),
            "activation_bytes": np.full((3, 1), 1000.0), "output_bytes": np.full((3, 1), 100.0)}
    cols.update({name: np.asarray(values, dtype=float)[:, None] for name, values in (extra or {}).items()})
    return make_profile(["a", "b", "c"], [4], cols, dict(meta or {}))
