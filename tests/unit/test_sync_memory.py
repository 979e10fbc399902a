"""Handing freed memory back to the operating system (glibc's malloc_trim)."""

from __future__ import annotations

import platform

import pytest

from celery_extras.sync import memory


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_malloc_trim_returns_the_pages_a_burst_left() -> None:
    def rss() -> int:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * 4096

    # a burst of large blocks, freed out of order so that the heap's top stays in use
    blocks = [bytearray(64 * 1024) for _ in range(2000)]
    keep = blocks[-1]
    del blocks
    before = rss()
    assert memory.malloc_trim() is True
    assert rss() < before
    assert keep


def test_without_malloc_trim_nothing_is_done(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "_libc_malloc_trim", lambda: None)
    assert memory.malloc_trim() is False
