"""A small U-Net with long skip connections, as a `module:factory` for tests and docs.

    --model tests.unet_model:build:width=4,image=16

Encoder enc1 -> down1 -> enc2 -> down2 -> mid, decoder up2 (+cat e2) -> dec2 -> up1 (+cat e1)
-> dec1 -> head. The concatenations are top-level `torch.cat` calls, so the encoder outputs
e1 and e2 travel past several layers: the skip edges planner.graph finds.
GroupNorm rather than BatchNorm, so micro-batches compute what one batch would.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["UNet", "build"]


def _block(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 3, padding=1), nn.GroupNorm(1, c_out), nn.ReLU(),
        nn.Conv2d(c_out, c_out, 3, padding=1), nn.GroupNorm(1, c_out), nn.ReLU(),
    )


class UNet(nn.Module):
    """Two-level U-Net: 10 top-level children, two long skips (e1 over 6 layers, e2 over 2)."""

    def __init__(self, channels: int = 3, width: int = 4, classes: int = 2):
        super().__init__()
        w = width
        self.enc1 = _block(channels, w)
        self.down1 = nn.MaxPool2d(2)
        self.enc2 = _block(w, 2 * w)
        self.down2 = nn.MaxPool2d(2)
        self.mid = _block(2 * w, 4 * w)
        self.up2 = nn.ConvTranspose2d(4 * w, 2 * w, 2, stride=2)
        self.dec2 = _block(4 * w, 2 * w)
        self.up1 = nn.ConvTranspose2d(2 * w, w, 2, stride=2)
        self.dec1 = _block(2 * w, w)
        self.head = nn.Conv2d(w, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e1 = self.enc1(x)
        e2 = self.enc2(self.down1(e1))
        m = self.mid(self.down2(e2))
        d2 = self.dec2(torch.cat([self.up2(m), e2], dim=1))
        d1 = self.dec1(torch.cat([self.up1(d2), e1], dim=1))
        return self.head(d1)


def build(width: int = 4, image: int = 16, channels: int = 3, classes: int = 2, seed: int = 0) -> UNet:
    """The U-Net with `make_batch(batch_size, seed) -> (images, labels)` and a per-pixel `loss_fn`."""
    if image % 4:
        raise ValueError(f"image size {image} must be a multiple of 4 (two 2x poolings)")
    torch.manual_seed(seed)
    model = UNet(channels, width, classes)

    def make_batch(batch_size: int, batch_seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(batch_seed)
        x = torch.randn(batch_size, channels, image, image, generator=g)
        y = torch.randint(0, classes, (batch_size, image, image), generator=g)
        return x, y

    def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.float(), labels)

    model.make_batch = make_batch  # type: ignore[attr-defined]
    model.loss_fn = loss_fn  # type: ignore[attr-defined]
    return model
