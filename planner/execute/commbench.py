"""Send/recv latency and bandwidth between neighbouring ranks, measured by ping-pong.

For calibration: the simulator models a transfer as latency + bytes / bandwidth, so each pair of
neighbours (r, r+1) bounces messages of a few sizes back and forth; half a round trip is one
transfer, and a least-squares line through (bytes, ms) gives latency (intercept) and
bandwidth (1 / slope). Pairs take turns so that they do not compete for the cores.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["SIZES", "ping_pong", "fit_line", "benchmark_neighbours"]

SIZES = (256, 64 * 1024, 1024 * 1024, 4 * 1024 * 1024)
_REPS = 8


def ping_pong(peer: int, initiator: bool, nbytes: int, device: torch.device, reps: int = _REPS) -> float:
    """Median one-way time in ms of a `nbytes` message between this rank and `peer`."""
    buf = torch.zeros(max(1, nbytes // 4), dtype=torch.float32, device=device)
    times = []
    for i in range(reps + 2):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        if initiator:
            dist.send(buf, peer)
            dist.recv(buf, peer)
        else:
            dist.recv(buf, peer)
            dist.send(buf, peer)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= 2:  # the first exchanges set up the connection
            times.append((time.perf_counter() - start) * 1e3 / 2)
    return statistics.median(times)


def fit_line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(latency ms, bandwidth bytes/s) of ms = latency + bytes / bandwidth, least squares."""
    n = len(points)
    if n < 2:
        return (points[0][1] if points else 0.0), float("inf")
    mx = sum(b for b, _ in points) / n
    my = sum(t for _, t in points) / n
    sxx = sum((b - mx) ** 2 for b, _ in points)
    slope = sum((b - mx) * (t - my) for b, t in points) / sxx if sxx else 0.0
    latency = max(0.0, my - slope * mx)
    bandwidth = 1e3 / slope if slope > 0 else float("inf")
    return latency, bandwidth


def benchmark_neighbours(rank: int, world: int, device: torch.device) -> list[dict[str, Any]]:
    """Every rank calls this; the lower rank of each pair returns its pair's measurement."""
    out = []
    for left in range(world - 1):
        dist.barrier()
        if rank in (left, left + 1):
            peer = left + 1 if rank == left else left
            points = [(float(n), ping_pong(peer, rank == left, n, device)) for n in SIZES]
            if rank == left:
                lat, bw = fit_line(points)
                out.append({"a": left, "b": left + 1, "latency_ms": lat,
                            "bandwidth_bytes_per_s": bw if bw != float("inf") else None,
                            "points": [[int(b), t] for b, t in points]})
    dist.barrier()
    return out
