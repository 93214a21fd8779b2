"""The U-Net of tests/unet_model.py as several graph tests use it: its layers, chain bytes, skip
edges, and a chain profile of it."""

from __future__ import annotations

from planner.graph import SkipEdge

from helpers.profiles import profile_csv

# The U-Net of tests/unet_model.py (width 4, image 16), bytes per sample as docs/graph.md lists.
UNET_NAMES = ("enc1", "down1", "enc2", "down2", "mid", "up2", "dec2", "up1", "dec1", "head")
UNET_OUTPUT_BYTES = (0, 1024, 0, 512, 1024, 4096, 2048, 8192, 4096, 2048)
"""Bytes per sample each layer hands the next (the chain; the skip tensors are UNET_EDGES)."""
UNET_EDGES = (SkipEdge(0, 7, 4096, (1,)), SkipEdge(2, 5, 2048, (3,)))

CHAIN = profile_csv(
    {"model": "tests.unet_model:build", "input_bytes_per_sample": 3072},
    [(i, name, 1, 1.0, 2.0, 0 if name.startswith("down") else 100, 10, out)
     for i, (name, out) in enumerate(zip(UNET_NAMES, UNET_OUTPUT_BYTES))],
)
"""The U-Net's layers as a plain chain profile (no edge lines), micro-batch size 1, made-up times."""
