"""Issue #14: a transfer's bytes move once the receiver has posted its receive.

torch.distributed.pipelining posts a receive just before the action that consumes it, so a rank
that was busy when its input was sent takes the input's bytes when it gets to that action. On the
2-core machine this was what the built-in ResNet's prediction missed (2 MB activations between 2
ranks: one late receive per forward of the receiving stage). These tests pin the rule with closed
forms, without timing anything.
"""

from __future__ import annotations

import pytest

from planner.calibration import Calibration
from planner.cost import StageCost, link_ms
from planner.cost.comm import Link, transfer_parts
from planner.plan import Device, Links
from planner.schedules import generate
from planner.simulate import simulate_costs


def _stage(s: int, f: float, b: float, in_bytes: float, out_bytes: float) -> StageCost:
    return StageCost(first=s, end=s + 1, recompute=(), fwd_ms=f, bwd_ms=b, bwd_input_ms=b / 2, bwd_weight_ms=b / 2,
                     recompute_ms=0.0, optimizer_ms=0.0, param_bytes=0.0, static_bytes=0.0, kept_bytes=1.0,
                     transient_bytes=0.0, input_bytes=in_bytes, output_bytes=out_bytes)


def test_transfer_parts_add_up_to_the_link_time() -> None:
    link = Link(bandwidth_bytes_per_s=2e9, latency_ms=0.25)
    lat, got = transfer_parts(4e6, link)
    assert (lat, got) == pytest.approx((0.25, 2.0))
    assert lat + got == pytest.approx(link_ms(4e6, link))
    cal = Calibration(comm_latency_ms=0.1, comm_bandwidth_bytes_per_s=1e9)
    assert transfer_parts(4e6, link, cal) == pytest.approx((0.1, 4.0))
    assert transfer_parts(0.0, link) == (0.0, 0.0)
    assert transfer_parts(4e6, None) == (0.0, 0.0)


@pytest.mark.parametrize("M", [1, 2, 4, 8])
def test_gpipe_receiver_takes_each_forward_input_when_it_gets_there(M: int) -> None:
    # The ResNet's shape: a light first stage, a heavy second one, 2 MB across the cut. Stage 1
    # is busy when each later forward input arrives: it receives the bytes before each forward.
    f0, b0, f1, b1 = 3.8, 6.1, 3.9, 10.0
    nbytes, bw, lat = 2 * 2**20, 3.3e9, 0.13
    copy = nbytes / bw * 1e3
    stages = [_stage(0, f0, b0, 0.0, nbytes), _stage(1, f1, b1, nbytes, 0.0)]
    r = simulate_costs(generate("gpipe", 2, M), stages, [0, 1], [Device("a"), Device("b")],
                       Links(bandwidth_bytes_per_s=bw, latency_ms=lat), micro_batch_size=1, record_timeline=True)
    # F0 ends, latency, stage 1 receives and computes every forward, then every backward; the
    # last gradient goes back (latency + bytes, stage 0 is waiting) and stage 0's last backward runs
    want = f0 + lat + M * (copy + f1) + M * b1 + lat + copy + b0
    assert r.iteration_ms == pytest.approx(want)
    assert r.busy_ms == pytest.approx((M * (f0 + b0), M * (f1 + b1)))  # receiving is not compute
    rows = sorted((x for x in r.timeline if x.device == 1 and x.kind in "CF"), key=lambda x: x.start_ms)
    backward = min(x.start_ms for x in r.timeline if x.device == 1 and x.kind == "B")
    received = [x for x in rows if x.kind == "C" and x.start_ms < backward]  # later ones: its sends' latency
    assert len(received) == M
    for c in received:  # each receive ends where its forward starts
        fwd = next(x for x in rows if x.kind == "F" and x.microbatch == c.microbatch)
        assert (c.stage, c.end_ms - c.start_ms, fwd.start_ms) == (1, pytest.approx(copy), pytest.approx(c.end_ms))


def test_a_waiting_receiver_gets_the_data_latency_plus_bytes_after_the_send() -> None:
    # Stage 0 slower than stage 1: stage 1 always waits, so no receive is late and the step is the
    # one of a transfer hidden behind nothing: latency + bytes after each of stage 0's forwards.
    f0, f1, b = 5.0, 1.0, 1.0
    nbytes, bw, lat = 1e6, 1e9, 0.5
    stages = [_stage(0, f0, b, 0.0, nbytes), _stage(1, f1, b, nbytes, 0.0)]
    r = simulate_costs(generate("gpipe", 2, 3), stages, [0, 1], [Device("a"), Device("b")],
                       Links(bandwidth_bytes_per_s=bw, latency_ms=lat), micro_batch_size=1, record_timeline=True)
    fwd1 = sorted((x for x in r.timeline if x.kind == "F" and x.stage == 1), key=lambda x: x.microbatch)
    for m, x in enumerate(fwd1):
        assert x.start_ms == pytest.approx((m + 1) * f0 + lat + 1.0)
