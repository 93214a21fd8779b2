"""The CPU allocator's count (torch.profiler memory events) and what the memory tracker leaves alive."""

from __future__ import annotations

import gc
from types import SimpleNamespace

import torch
from torch import nn

from planner.execute.measure import MemoryTracker
from planner.profiling.allocpeak import CpuAllocatorMeter, peak_above_start, window_peak

MIB = 1 << 20


def test_peak_above_start_counts_what_a_region_allocates_and_holds():
    keep = []

    def run() -> None:
        a = torch.empty(MIB // 4)  # 1 MiB, freed at the end of run
        keep.append(torch.empty(MIB // 2))  # 2 MiB, still held after run
        b = torch.empty(MIB // 4)  # 1 MiB while a and the kept 2 MiB are alive: the peak
        del a, b

    got = peak_above_start(run)
    assert 4 * MIB <= got < 4 * MIB + 64 * 1024


def test_a_block_freed_while_no_profiler_ran_does_not_count_in_the_next_session():
    # torch keeps its count across profiler sessions and never subtracts a block freed between
    # them; the peak of a later region must not carry it
    held = []
    peak_above_start(lambda: held.append(torch.empty(4 * MIB // 4)))
    held.clear()  # freed with no profiler running: torch's count keeps its 4 MiB
    got = peak_above_start(lambda: torch.empty(MIB // 4))
    assert MIB <= got < MIB + 64 * 1024


def test_meter_window_reports_the_count_it_opened_with():
    meter = CpuAllocatorMeter().start()
    weights = torch.empty(2 * MIB // 4)  # allocated under the meter, before the window
    with meter.window():
        tmp = torch.empty(MIB // 4)
        del tmp
    got = meter.stop()
    assert got is not None and got.start_bytes >= 2 * MIB
    assert got.peak_bytes - got.start_bytes == MIB
    del weights


def test_window_peak_reads_an_event_tree():
    allocation = type("_ExtraFields_Allocation", (), {})  # the profiler's class name is what it checks

    def node(name, t0, t1=None, children=(), alloc=None):
        extra = None
        if alloc is not None:
            extra = allocation()
            extra.total_allocated, extra.alloc_size = alloc
        return SimpleNamespace(name=name, start_time_ns=t0, end_time_ns=t1 or t0, children=list(children), extra_fields=extra)

    roots = [
        node("[memory]", 1, alloc=(100, 100)),
        node("win", 10, 20, children=[node("[memory]", 11, alloc=(150, 50)), node("[memory]", 12, alloc=(90, -60))]),
        node("[memory]", 30, alloc=(500, 410)),
    ]
    got = window_peak(roots, "win")
    assert (got.start_bytes, got.peak_bytes, got.events) == (100, 150, 2)
    assert window_peak(roots, "absent") is None


def test_tracked_graph_that_never_runs_backward_is_freed_when_dropped():
    # A tanh saves its own output: held with its autograd history, that output would point back at
    # the node holding it, and a graph nobody runs backward (torch's first-step metadata
    # inference) would stay alive with all it saved.
    layer = nn.Sequential(nn.Linear(64, 64), nn.Tanh())
    x = torch.randn(32, 64)
    tk = MemoryTracker(exclude=list(layer.parameters()) + [x])
    with tk:
        out = layer(x)
    assert tk.live == 32 * 64 * 4  # the tanh output (the Linear's input is excluded)
    del out
    gc.collect()
    assert tk.live == 0  # every saved tensor was released with the graph
