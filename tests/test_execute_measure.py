"""Executor measurement in one process: saved-activation tracking, action timing, recompute."""

from __future__ import annotations

import mmap

import pytest
import torch
from torch import nn

from planner.execute.measure import ActionRecorder, MemoryTracker, recorder, set_tracker
from planner.execute.stages import Checkpointed


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 8))


def test_tracker_counts_saved_activations_once_and_frees_them_after_backward():
    model = _mlp()
    x = torch.randn(16, 32)
    tk = MemoryTracker(exclude=list(model.parameters()) + [x])
    with tk:
        out = model(x)
    # Linear(32,64) saves x (excluded), Tanh saves its output (16x64 floats), Linear(64,8) saves
    # its input = the same tanh output: one storage, counted once.
    assert tk.live == 16 * 64 * 4
    assert tk.peak == tk.live
    out.sum().backward()
    del out
    assert tk.live == 0
    assert tk.peak == 16 * 64 * 4


def test_tracker_ignores_parameters():
    lin = nn.Linear(8, 8)
    x = torch.randn(4, 8, requires_grad=True)
    tk = MemoryTracker(exclude=list(lin.parameters()))
    with tk:
        y = lin(x)
    assert tk.live == 4 * 8 * 4  # x only, not the weight the matmul also saves
    y.sum().backward()


def test_checkpointed_layer_keeps_only_its_input_and_reports_a_transient():
    torch.manual_seed(0)
    inner = nn.Sequential(nn.Linear(32, 128), nn.Tanh(), nn.Linear(128, 32))
    layer = Checkpointed(inner)
    x = torch.randn(8, 32, requires_grad=True)
    tk = MemoryTracker(exclude=list(layer.parameters()))
    set_tracker(tk)
    try:
        with tk:
            y = layer(x)
        kept = tk.live
        assert kept == 8 * 32 * 4  # the checkpoint's input, nothing inside the layer
        transient = tk.transient_bytes[id(layer)]
        assert transient >= 8 * 128 * 4  # un-checkpointed the layer saves at least the tanh output
        rec = recorder()
        rec.clear()
        rec.record(0, "B", 0, lambda: y.sum().backward())
    finally:
        set_tracker(None)
    kinds = [e.kind for e in rec.events]
    assert kinds == ["R", "B"]  # the recompute ran inside the backward and got its own row
    r, b = rec.events
    assert r.start <= r.end == b.start <= b.end
    assert tk.peak >= kept + transient
    assert tk.transient == 0  # reset when the backward ended


def test_checkpointed_gradients_equal_plain_layer():
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(16, 16), nn.GELU())
    wrapped = Checkpointed(plain)
    x = torch.randn(4, 16)
    plain(x).pow(2).sum().backward()
    g1 = [p.grad.clone() for p in plain.parameters()]
    for p in plain.parameters():
        p.grad = None
    wrapped(x).pow(2).sum().backward()
    for a, p in zip(g1, plain.parameters()):
        assert torch.equal(a, p.grad)


class _Clock:
    """Stands in for measure's `time`: perf_counter reads seconds that only `advance` moves."""

    def __init__(self) -> None:
        self.now = 50.0

    def perf_counter(self) -> float:
        return self.now

    def thread_time(self) -> float:  # a thread that never waits: its CPU time is the wall time
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def test_recorder_keeps_actions_in_execution_order_and_extends_forward_by_the_loss(monkeypatch):
    from planner.execute import measure

    clock = _Clock()
    monkeypatch.setattr(measure, "time", clock)
    rec = ActionRecorder()
    rec.record(1, "F", 0, lambda: clock.advance(0.002))
    rec.extend_forward(1, 0, lambda: clock.advance(0.003))
    rec.record(1, "I", 0, lambda: clock.advance(0.004))
    rec.record(1, "W", 0, lambda: None)
    assert [(e.stage, e.kind, e.microbatch) for e in rec.events] == [(1, "F", 0), (1, "I", 0), (1, "W", 0)]
    f, i, w = rec.events
    assert (f.start, f.end) == (50.0, pytest.approx(50.005))  # the loss (3 ms) extends F (2 ms)
    assert i.end - i.start == pytest.approx(0.004) and w.end == w.start == i.end
    assert (f.cpu_ms, i.cpu_ms, w.cpu_ms) == (pytest.approx(2.0), pytest.approx(4.0), 0.0)  # the loss is wall only
    with pytest.raises(ValueError):
        rec.record(1, "B", 1, lambda: (clock.advance(0.001), (_ for _ in ()).throw(ValueError("boom"))))
    assert rec.events[-1].end - rec.events[-1].start == pytest.approx(0.001)
    assert rec.events[-1].kind == "B"  # a failed action is still timed


def test_rss_window_reads_the_kernels_high_water_mark(tmp_path):
    from planner.execute.measure import RssWindow, read_rss

    if read_rss() is None:
        pytest.skip("no /proc/self/status VmRSS/VmHWM here")
    w = RssWindow(baseline=read_rss()[0]).begin()
    # 64 MiB of fresh pages straight from the kernel (an anonymous mapping, every page touched):
    # a tensor could reuse memory this process freed earlier and kept (planner.allocator keeps it
    # once any test has profiled or trained in this process) and leave the resident set as it was.
    size = 64 * 2**20
    block = mmap.mmap(-1, size)
    for offset in range(0, size, mmap.PAGESIZE):
        block[offset] = 1
    block.close()
    w.end()
    if w.peak_rss is None:
        pytest.skip("the kernel refused to reset the high-water mark (/proc/self/clear_refs)")
    # the block is gone, but the window's peak saw it
    assert w.growth_bytes >= 48 * 2**20
    assert set(w.to_dict()) == {"rss_baseline_bytes", "rss_step_start_bytes", "rss_step_peak_bytes", "rss_growth_bytes"}
    status = tmp_path / "status"
    status.write_text("Name: x\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\n")
    assert read_rss(str(status)) == (1024 * 1024, 2048 * 1024)
    status.write_text("Name: x\n")
    assert read_rss(str(status)) is None
