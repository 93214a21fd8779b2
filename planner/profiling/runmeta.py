"""The metadata lines of a measured profile: what was measured, how, where and under what load.

Apart from planner.profiling.profiler to keep that module to its measuring.
"""

from __future__ import annotations

import datetime as _dt
import time
from typing import Any

import torch

from planner.hostinfo import cpu_model, load_average
from planner.models import parse_spec

__all__ = ["device_name", "profile_meta"]


def device_name(dev: torch.device) -> str:
    """The GPU's name, or the CPU's model."""
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    return cpu_model()


def profile_meta(spec: str, bundle: Any, *, seed: int, dev: torch.device, dtype: str, command: str | None,
                 input_bytes: float, target_bytes: float, warmup: int, repeats: int, timer: str, co_run: int,
                 input_shape: tuple[int, ...] | None, input_dtype: str, vocab: int | None, started: float) -> dict[str, str]:
    """The profile's metadata lines: what was measured, how, where and under what load."""
    meta = {
        "model": spec,
        "seed": str(seed),
        "device": str(dev),
        "device_name": device_name(dev),
        "dtype": dtype,
        "torch": torch.__version__,
        "threads": str(torch.get_num_threads()),
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": " ".join((command or "").splitlines()),
        "input_bytes_per_sample": f"{input_bytes:g}",
        "target_bytes_per_sample": f"{target_bytes:.12g}",
        "warmup": str(warmup),
        "repeats": str(repeats),
        "timer": "wall minus run-queue wait" if timer == "sched" else "wall",
        "co_run": str(co_run),
    }
    kind = parse_spec(spec)[0]
    if kind == "factory" and input_shape is not None:
        meta.update(input_shape=",".join(map(str, input_shape)), input_dtype=input_dtype, vocab=str(vocab or ""))
    elif kind == "hf":  # the input the model was built for (planner.models.hf), for `pplan run`
        meta.update(getattr(bundle, "input_meta", None) or {})
    meta["elapsed_s"] = f"{time.perf_counter() - started:.1f}"
    load = load_average()
    if load is not None:  # `pplan run` compares it with the load it runs under
        meta["load_average"] = f"{load:g}"
    return meta
