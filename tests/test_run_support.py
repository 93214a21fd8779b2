"""Helpers shared by the tests (no tests here): plans, exact synthetic profiles, CLI runs, equal
torch thread counts for equivalence runs, and decoding the figures a test drew."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

REPO = Path(__file__).resolve().parents[1]


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


def pplan(*args: str, timeout: float = 120, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run the CLI in a subprocess (as a user would), capturing output."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "cli.app", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd or REPO, env=env)


EQUIVALENCE_THREADS = 1
"""torch threads in every rank and in the single-process reference of an equivalence test.

CPU kernels (conv and matmul weight gradients) split their reductions by thread, so a different
thread count changes float32 summation order; with the same count, shapes and order, a pipelined
run and the reference compute the same bits."""


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run the block with `n` torch threads, restoring the previous count after."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _rgb(color: str) -> tuple[float, float, float]:
    from matplotlib.colors import to_rgb

    return to_rgb(color)


def png_pixels(src: "Path | bytes"):
    """RGB pixels (height x width x 3, floats 0..1) of a PNG file or bytes, decoded in full."""
    import io

    import matplotlib.image as mpimg

    data = src if isinstance(src, bytes) else Path(src).read_bytes()
    assert data[:8] == PNG_MAGIC, "not a PNG"
    return mpimg.imread(io.BytesIO(data), format="png")[..., :3]


def color_share(pixels, color: str, tol: float = 2 / 255) -> float:
    """Fraction of pixels within `tol` (per channel) of `color`."""
    import numpy as np

    return float((np.abs(pixels - np.array(_rgb(color))) <= tol).all(axis=-1).mean())


def assert_drawn_png(src: "Path | bytes", min_width: int = 300, min_height: int = 150,
                     colors: tuple[str, ...] = ()) -> Any:
    """A whole, decodable picture of at least that size with something drawn on it (not blank,
    not one solid fill) and every one of `colors` on it; returns the pixels."""
    import numpy as np

    px = png_pixels(src)
    h, w = px.shape[:2]
    assert w >= min_width and h >= min_height, (w, h)
    ink = float((px < 0.9).any(axis=-1).mean())  # anything clearly darker than white
    assert 0.005 < ink < 0.95, f"{ink:.1%} of the pixels are drawn"
    assert len(np.unique((px * 255).round().reshape(-1, 3), axis=0)) >= 8, "too few colours for a chart"
    for c in colors:
        assert color_share(px, c) > 0, f"no {c} on the figure"
    return px
