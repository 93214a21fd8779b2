"""A made-up machine entry, for tests that replace `pplan calibrate --machine`'s bench with one that
returns at once (the `machine_bench` fixture in conftest.py)."""

from __future__ import annotations

from planner.machine import Machine

__all__ = ["made_up_machine"]


def made_up_machine(ranks: int) -> Machine:
    """The entry the fake bench returns for `ranks` processes (fixed values, no measurement)."""
    return Machine(device_type="cpu", backend="gloo", ranks=ranks, threads=1, action_overhead_ms=0.2,
                   comm_latency_ms=0.1, comm_bandwidth_bytes_per_s=2e9, step_overhead_ms=1.0)
