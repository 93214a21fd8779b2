"""Will it fit: memory checks `pplan profile` makes before it allocates a batch or a co-run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from planner.errors import PplanError
from planner.profiling.saved import tensor_bytes

__all__ = ["available_ram", "check_batch_fits", "check_next_size_fits", "check_co_run_memory"]


def available_ram() -> int | None:
    """Bytes this process could still allocate: MemAvailable, capped by a cgroup limit."""
    avail: int | None = None
    try:
        with open("/proc/meminfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
        if limit != "max":
            room = max(0, int(limit) - used)
            avail = room if avail is None else min(avail, room)
    except (OSError, ValueError):
        pass
    return avail


def check_batch_fits(bundle: Any, spec: str, sizes: list[int], dev: torch.device, seed: int = 0) -> None:
    """Refuse, before allocating it, a micro-batch whose input and target alone exceed the
    memory this machine has left (RAM, and the GPU's free memory with --device cuda).

    The bytes per sample come from a batch of one; a batch of `size` holds `size` times that.
    """
    x, target = bundle.make_batch(1, seed)
    per_sample = tensor_bytes(x) + tensor_bytes(target)
    if per_sample <= 0:
        return
    largest = max(sizes)
    need = per_sample * largest
    room = [("RAM", available_ram())]
    if dev.type == "cuda":
        free, _total = torch.cuda.mem_get_info(dev)
        room.append((f"{dev} memory", int(free)))
    for where, avail in room:
        if avail is not None and need > avail:
            from planner.units import format_bytes

            fits = max(0, avail // per_sample)
            raise PplanError(
                f"micro-batch size {largest} of model {spec!r} needs {format_bytes(need)} for its input and target alone "
                f"({format_bytes(per_sample)} per sample), more than the {format_bytes(avail)} of {where} available",
                f"the input alone would fit up to {fits:,} samples and the layers need several times more: profile much "
                "smaller sizes, e.g. 1,2,4,8" if fits else "this model's samples do not fit this machine")


def check_next_size_fits(cols: dict[str, Any], names: list[str], sizes: list[int], k: int, spec: str,
                         dev: torch.device) -> None:
    """Refuse micro-batch size sizes[k] before measuring it when, scaled from the size just measured,
    one layer's kept activations, output and input (what measuring it holds at once) would exceed
    the memory left: the input check (check_batch_fits) passed a 7,000,000-sample mlp whose first
    layer's output alone is 26.7 GiB, and the OOM killer, not pplan, would have answered."""
    if k == 0:
        return
    scale = sizes[k] / sizes[k - 1]
    act, out = cols["activation_bytes"][:, k - 1], cols["output_bytes"][:, k - 1]
    held = [(act[i] + out[i] + (out[i - 1] if i else 0.0)) * scale for i in range(len(names))]
    worst = max(range(len(names)), key=held.__getitem__)
    room = [("RAM", available_ram())]
    if dev.type == "cuda":  # what the device has free, and what torch's cache holds free for reuse
        cached = torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev)
        room.append((f"{dev} memory", int(torch.cuda.mem_get_info(dev)[0]) + int(cached)))
    for where, avail in room:
        if avail is not None and held[worst] > avail:
            from planner.units import format_bytes

            fits = int(sizes[k - 1] * avail / (held[worst] / scale))
            raise PplanError(
                f"micro-batch size {sizes[k]} of model {spec!r}: layer {worst} ({names[worst]}) would hold about "
                f"{format_bytes(held[worst])} while measured (scaled from size {sizes[k - 1]}), more than the "
                f"{format_bytes(avail)} of {where} available", f"profile sizes up to about {max(1, fits):,}")


def check_co_run_memory(bundle: Any, spec: str, co_run: int) -> None:
    """Refuse a co-run whose workers' weights, gradients and Adam moments alone exceed the RAM."""
    need = co_run * 4 * sum(p.numel() * p.element_size() for p in bundle.layers.parameters())
    avail = available_ram()
    if co_run and avail is not None and need > avail:
        from planner.units import format_bytes
        raise PplanError(f"--co-run {co_run} of model {spec!r} needs {format_bytes(need)} for the background copies' "
                         f"parameters, gradients and Adam state, more than the {format_bytes(avail)} of RAM available",
                         "lower --co-run, or profile without it")
