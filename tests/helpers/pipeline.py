"""The whole user path in real processes: profile a model, partition it onto two CPU ranks, run the plan."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from helpers.cli import run_pplan

__all__ = ["profile_partition_run"]


def profile_partition_run(folder: Path, model: str, memory: str, profile_flags: Sequence[str] = ()) -> dict[str, Any]:
    """The run JSON of `model` (a `module:factory` importable from `folder`) profiled at micro-batch 8 with
    `profile_flags`, partitioned onto two devices of `memory` each (1f1b, 8 micro-batches of a global batch 64,
    no recompute) and run 3 steps on the cpu; each step must exit 0 (its stderr is the failure message)."""
    prof, plan, out = folder / "profile.csv", folder / "plan.json", folder / "run.json"
    steps = {
        "profile": ("profile", "--model", model, *profile_flags, "-b", "8", "--repeats", "2", "--warmup", "1", "-o", prof),
        "partition": ("partition", prof, "--devices", "2", "--memory", memory, "--global-batch", "64",
                      "--microbatches", "8", "--schedule", "1f1b", "--recompute", "none", "--out", plan),
        "run": ("run", plan, "--device", "cpu", "--steps", "3", "--warmup", "1", "--model", model, "--out", out),
    }
    for name, args in steps.items():
        res = run_pplan(*args, cwd=folder, timeout=300, PPLAN_MACHINE="off")
        assert res.returncode == 0, f"pplan {name} exited {res.returncode}: {res.stderr}"
    return json.loads(out.read_text())
