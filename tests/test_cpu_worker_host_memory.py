"""Host store memory (cpu_worker/host_memory.py): THP mode parsing and huge-page backed tensors."""

import gc

import pytest
import torch

from scout_sglang.cpu_worker import host_memory
from scout_sglang.cpu_worker.host_memory import (
    HUGE_PAGE_BYTES,
    alloc_host_tensor,
    alloc_store_tensor,
    anon_huge_kib,
    thp_state,
)

SHAPE = (128, 8, 32, 128)  # 8 MiB of bf16: four huge pages


@pytest.mark.parametrize(
    "text, expected",
    [("always [madvise] never\n", "madvise"), ("[always] madvise never\n", "always"), ("always madvise [never]", "never")],
)
def test_thp_state_reads_the_bracketed_mode(tmp_path, text, expected):
    path = tmp_path / "enabled"
    path.write_text(text)
    assert thp_state(path) == expected


def test_thp_state_without_the_file(tmp_path):
    assert thp_state(tmp_path / "missing") == "unavailable"


def test_tensor_is_zeroed_writable_and_outlives_its_base():
    t, kind = alloc_host_tensor(SHAPE, torch.bfloat16)
    assert kind in ("thp", "4k") and t.shape == SHAPE and t.dtype == torch.bfloat16
    assert torch.count_nonzero(t) == 0
    if kind == "thp":
        assert t.data_ptr() % HUGE_PAGE_BYTES == 0, "the store must start on a huge-page boundary"
    t[5].fill_(2.0)
    view = t[5]
    del t
    gc.collect()
    assert torch.all(view == 2.0), "a view must keep the mapping alive"


def test_huge_pages_when_the_system_allows():
    if thp_state() not in ("always", "madvise"):
        pytest.skip(f"transparent huge pages are {thp_state()} here")
    t, kind = alloc_host_tensor(SHAPE, torch.bfloat16)
    assert kind == "thp"
    t.fill_(1.0)  # first touch faults the pages in
    huge = anon_huge_kib([(t.data_ptr(), t.numel() * t.element_size())])
    if huge is None:
        pytest.skip("/proc/self/smaps is not readable")
    # madvised ranges are compacted for on fault (defrag "madvise", the default), so 8 MiB gets some.
    assert huge >= HUGE_PAGE_BYTES // 1024, f"no huge page in a madvised 8 MiB range (THP {thp_state()})"


@pytest.mark.parametrize("reason", ["asked", "never", "small"])
def test_plain_pages_when_not_wanted_or_not_allowed(monkeypatch, reason):
    shape = SHAPE
    if reason == "never":
        monkeypatch.setattr(host_memory, "thp_state", lambda: "never")
    if reason == "small":
        shape = (4, 128)  # below one huge page: madvise would gain nothing
    t, kind = alloc_host_tensor(shape, torch.float32, huge_pages=reason != "asked")
    assert kind == "4k" and t.shape == shape and torch.count_nonzero(t) == 0


def test_store_tensor_logs_its_page_kind_once(monkeypatch, caplog):
    monkeypatch.setattr(host_memory, "_logged_kinds", set())
    with caplog.at_level("INFO", logger="scout_sglang.cpu_worker"):
        a = alloc_store_tensor(SHAPE, torch.bfloat16, pin=False)
        b = alloc_store_tensor(SHAPE, torch.bfloat16, pin=False)
    lines = [r.getMessage() for r in caplog.records if "host K/V store pages" in r.getMessage()]
    expected = "thp" if thp_state() in ("always", "madvise") else "4k"
    assert lines == [f"host K/V store pages: {expected} (transparent huge pages: {thp_state()})"]
    assert a.shape == b.shape == SHAPE and a.data_ptr() != b.data_ptr()
