"""planner.allocator: glibc keeps freed blocks for reuse in pplan's measuring and training processes."""

from __future__ import annotations

import sys

import pytest

from planner import allocator


@pytest.fixture(autouse=True)
def _fresh_process_cache():
    """Each test starts and leaves keep_freed_memory as a fresh process has it (nothing cached),
    so that a faked C library's answer does not stay for the tests after it."""
    allocator.keep_freed_memory.cache_clear()
    yield
    allocator.keep_freed_memory.cache_clear()


def test_keep_freed_memory_sets_glibc_thresholds_once(monkeypatch):
    calls = []

    def mallopt(param, value):
        calls.append((param, value))
        return 1

    class FakeLibc:  # attributes as ctypes gives them: a function one can set argtypes on
        pass

    FakeLibc.mallopt = staticmethod(mallopt)
    monkeypatch.setattr(allocator.sys, "platform", "linux")
    monkeypatch.setattr(allocator.ctypes, "CDLL", lambda name: FakeLibc())
    assert allocator.keep_freed_memory() is True
    assert allocator.keep_freed_memory() is True  # idempotent: set once per process
    assert calls == [(allocator.M_MMAP_THRESHOLD, allocator.MMAP_THRESHOLD_BYTES),
                     (allocator.M_TRIM_THRESHOLD, allocator.TRIM_THRESHOLD_BYTES)]
    assert allocator.MMAP_THRESHOLD_BYTES == 32 * 2**20 and allocator.TRIM_THRESHOLD_BYTES < 2**31  # mallopt's int


def test_not_glibc_changes_nothing(monkeypatch):
    def no_libc(name):
        raise OSError("no such library")

    monkeypatch.setattr(allocator.sys, "platform", "linux")
    monkeypatch.setattr(allocator.ctypes, "CDLL", no_libc)
    assert allocator.keep_freed_memory() is False
    allocator.keep_freed_memory.cache_clear()
    monkeypatch.setattr(allocator.sys, "platform", "darwin")
    assert allocator.keep_freed_memory() is False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_this_linux_accepts_the_settings():
    assert allocator.keep_freed_memory() is True
