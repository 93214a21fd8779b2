"""Communication time: a point-to-point transfer over one link between two devices.

A transfer of n bytes over a link costs latency + n x ms_per_byte, where ms_per_byte is
1e3 / bandwidth (bytes per second); nothing crosses (0 ms) when n <= 0 or both ends are the
same device. A calibration's comm_latency_ms / comm_bandwidth_bytes_per_s replace every link's
values (they were measured between the processes that actually run the plan).

`link_ms` is that rule; the partitioner keeps each boundary's (latency, ms_per_byte) in its
problem arrays and prices them with `transfer_ms`, the simulator prices each send with
`transfer_parts`, whose two parts add up to `link_ms`, so both charge the same bits for the
same bytes.

Where the two parts fall (`transfer_parts`): torch.distributed.pipelining posts a receive just
before the action that needs it, and the bytes of a point-to-point transfer move only once both
ends have posted (gloo over TCP: the socket holds a fraction of a 2 MB tensor, the rest waits for
the receiver to read; NCCL: the send and receive kernels meet). So the latency runs on the link
as soon as the sender is done, and the bytes x ms_per_byte part runs on the receiver, after it
has reached the action: a receiver busy when the data was sent pays it when it gets there.
Measured on the 2-core CPU machine (ResNet, 2 MB activations, 2 ranks): a receive posted late
waited 0.3-0.8 ms after posting (+0.1-0.6 ms inside the post), against 0.63 ms for the bytes at
the machine's 3.3 GB/s.

What a hand-over costs the two ranks themselves (`handover_cpu_ms`): on a CPU machine whose
cores all run a rank's compute, gloo's own thread has to displace one to move the bytes, and
either rank loses time to it (`pplan bench handover`: 0.5-1.4 ms per hand-over there, against
0.1-0.5 ms with the ranks idle). The machine file carries it, measured where ranks fill the
cores; the simulator charges it to the sending and to the receiving action. GPUs, whose copy
engines move the bytes, and machines with a core to spare have none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from planner.calibration import Calibration

if TYPE_CHECKING:  # planner.plan imports planner.cost; the type is only needed for hints
    from planner.plan import Links

__all__ = ["Link", "link_between", "link_terms", "ms_per_byte", "transfer_ms", "link_ms", "transfer_parts", "handover_cpu_ms"]


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
    return lat, ms_per_byte(bw)


def ms_per_byte(bandwidth_bytes_per_s: float) -> float:
    """Milliseconds one byte takes at `bandwidth_bytes_per_s`: the one conversion, so that the cost
    model and the calibration's fit of a hand-over's latency (planner.execute.calibrate) agree."""
    return 1e3 / bandwidth_bytes_per_s


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


def transfer_parts(nbytes: float, link: Link | None, calibration: Calibration | None = None) -> tuple[float, float]:
    """(link part, receiver part) of sending `nbytes` over `link`, ms; (0, 0) when nothing crosses.

    The link part is the latency, from the sender's end (transfers on one link queue first in
    first out); the receiver part, nbytes x ms_per_byte, runs once the receiver has posted its
    receive, just before the action that consumes the data (module docstring). They add up to
    `link_ms(nbytes, link, calibration)`.
    """
    if link is None or nbytes <= 0:
        return 0.0, 0.0
    latency, per_byte = link_terms(link, calibration)
    return float(latency), float(nbytes * per_byte)


def handover_cpu_ms(nbytes: float, calibration: Calibration | None = None) -> float:
    """What one cross-rank hand-over of `nbytes` costs each of the two ranks, ms (module
    docstring): the calibration's intercept plus its ms per MiB; 0 without one, or for nothing sent."""
    if calibration is None or nbytes <= 0:
        return 0.0
    return float(calibration.handover_cpu_ms + calibration.handover_cpu_ms_per_mib * nbytes / 2**20)
