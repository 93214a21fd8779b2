"""Communication time: a point-to-point transfer over one link between two devices.

A transfer of n bytes over a link costs latency + n x ms_per_byte, where ms_per_byte is
1e3 / bandwidth (bytes per second); nothing crosses (0 ms) when n <= 0 or both ends are the
same device. A calibration's comm_latency_ms / comm_bandwidth_bytes_per_s replace every link's
values (they were measured between the processes that actually run the plan).

`link_ms` is that rule; the partitioner keeps each boundary's (latency, ms_per_byte) in its
problem arrays and prices them with `transfer_ms`, the simulator calls `link_ms` per send, so
both charge the same bits for the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from planner.calibration import Calibration

if TYPE_CHECKING:  # planner.plan imports planner.cost; the type is only needed for hints
    from planner.plan import Links

__all__ = ["Link", "link_between", "link_terms", "transfer_ms", "link_ms"]


@dataclass(frozen=True)
class Link:
    """A link between two devices as the plan describes it (before calibration)."""

    bandwidth_bytes_per_s: float
    """Bytes per second."""
    latency_ms: float
    """Fixed cost per message, ms."""


def link_between(links: "Links", a: int, b: int) -> Link | None:
    """The link from device a to device b (None on the same device: nothing is sent)."""
    if a == b:
        return None
    bw, lat = links.between(a, b)
    return Link(bandwidth_bytes_per_s=bw, latency_ms=lat)


def link_terms(link: Link | None, calibration: Calibration | None = None) -> tuple[float, float]:
    """(latency ms, ms per byte) of `link` after the calibration's overrides; (0, 0) for no link."""
    if link is None:
        return 0.0, 0.0
    bw, lat = link.bandwidth_bytes_per_s, link.latency_ms
    if calibration is not None and calibration.comm_bandwidth_bytes_per_s is not None:
        bw = calibration.comm_bandwidth_bytes_per_s
    if calibration is not None and calibration.comm_latency_ms is not None:
        lat = calibration.comm_latency_ms
    return lat, 1e3 / bw


def transfer_ms(nbytes: Any, latency_ms: Any, ms_per_byte: Any) -> Any:
    """latency + nbytes x ms_per_byte where nbytes > 0, else 0 (elementwise for arrays)."""
    if np.ndim(nbytes) == 0:
        return 0.0 if nbytes <= 0 else float(latency_ms + nbytes * ms_per_byte)
    nb = np.asarray(nbytes, dtype=float)
    return np.where(nb > 0, latency_ms + nb * ms_per_byte, 0.0)


def link_ms(nbytes: Any, link: Link | None, calibration: Calibration | None = None) -> Any:
    """Time to send `nbytes` over `link` (0 when nothing crosses or there is no link), ms."""
    if link is None:
        return 0.0 if np.ndim(nbytes) == 0 else np.zeros(np.shape(nbytes))
    return transfer_ms(nbytes, *link_terms(link, calibration))
