"""Host store memory (cpu_worker/host_memory.py): THP mode parsing, huge-page backed tensors, their page-locking
for a CUDA device (with a recording stand-in for torch.cuda.cudart()) and the page report."""

import gc

import pytest
import torch

from scout_sglang.cpu_worker import host_memory
from fake_cudart import FakeCudart, mapped

from scout_sglang.cpu_worker.host_memory import (
    HUGE_PAGE_BYTES,
    alloc_host_buffer,
    alloc_host_tensor,
    alloc_store_tensor,
    anon_huge_kib,
    buffers_of,
    page_report,
    register_page_locked,
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


def test_store_tensor_logs_its_page_kind_and_huge_page_share_once(monkeypatch, caplog):
    monkeypatch.setattr(host_memory, "_logged_kinds", set())
    with caplog.at_level("INFO", logger="scout_sglang.cpu_worker"):
        a, first = alloc_store_tensor(SHAPE, torch.bfloat16, device="cpu")
        b, _ = alloc_store_tensor(SHAPE, torch.bfloat16, device="cpu")
    lines = [r.getMessage() for r in caplog.records if "host K/V store pages" in r.getMessage()]
    expected = "thp" if thp_state() in ("always", "madvise") else "4k"
    assert len(lines) == 1 and first.kind == expected
    # on a CPU device nothing is pre-faulted: the share is 0 until the blocks are written
    assert lines[0] == (f"host K/V store pages: {expected}, first buffer: {expected}, 0.0% of 8.0 MiB on 2 MiB "
                        f"pages (0.0% resident: pages fault in as written) (transparent huge pages: {thp_state()})")
    assert a.shape == b.shape == SHAPE and a.data_ptr() != b.data_ptr()


# -- page-locking for a CUDA device, with torch.cuda.cudart() replaced by a recording fake ------------------------
ODD_SHAPE = (2 * 1024 + 3, 4, 128)  # bf16: 2 MiB + 3 KiB, a partial last huge page and a partial last 4 KiB page


def huge_pages_allowed() -> bool:
    return thp_state() in ("always", "madvise")


def measured(buffer) -> tuple[int, int]:
    result = host_memory.smaps_bytes([(buffer.address, buffer.nbytes)])
    if result is None:
        pytest.skip("/proc/self/smaps is not readable")
    return result


@pytest.fixture
def cudart(monkeypatch):
    fake = FakeCudart()
    monkeypatch.setattr(torch.cuda, "cudart", lambda: fake)
    return fake


def test_a_cuda_buffer_is_prefaulted_and_registered_once_at_its_exact_address_and_size(cudart):
    tensors = [alloc_host_buffer(shape, torch.bfloat16, device="cuda") for shape in (SHAPE, ODD_SHAPE, (3, 5))]
    assert cudart.of("register") == [("register", t.data_ptr(), t.numel() * t.element_size(), 0)
                                     for t, _ in tensors]
    for (t, buffer), shape in zip(tensors, (SHAPE, ODD_SHAPE, (3, 5))):
        assert t.shape == shape and torch.count_nonzero(t) == 0 and buffer.registered
        assert (buffer.address, buffer.nbytes) == (t.data_ptr(), t.numel() * t.element_size())
        resident, huge = measured(buffer)
        assert resident == buffer.nbytes, "registration needs every page resident: pre-faulted, not left to faults"
        if huge_pages_allowed() and buffer.nbytes >= HUGE_PAGE_BYTES:
            assert buffer.kind == "thp+registered" and t.data_ptr() % HUGE_PAGE_BYTES == 0
            assert huge >= 0.9 * buffer.nbytes, f"{huge} of {buffer.nbytes} bytes on huge pages"
        else:
            assert buffer.kind == "4k+registered"
    assert tensors[2][1].kind == "4k+registered"  # under a huge page: not worth one


def test_a_freed_buffer_is_unregistered_while_still_mapped_then_unmapped(cudart):
    t, buffer = alloc_host_buffer(ODD_SHAPE, torch.bfloat16, device="cuda")
    address, nbytes = buffer.address, buffer.nbytes
    view = t[7:9]
    del t
    gc.collect()
    assert cudart.of("unregister") == [], "a view keeps the memory, and its registration"
    del view
    gc.collect()
    assert cudart.of("unregister") == [("unregister", address, True)], "unregistered once, before the unmap"
    assert cudart.registered == {} and not mapped(address, nbytes)


def test_an_unregistered_buffer_is_not_unregistered_again_when_freed(cudart):
    t, buffer = alloc_host_buffer(SHAPE, torch.bfloat16, device="cuda")
    buffer.unregister()  # an engine's close()
    buffer.unregister()
    del t
    gc.collect()
    assert len(cudart.of("unregister")) == 1 and cudart.registered == {}


def test_a_failing_register_warns_and_falls_back_to_torch_page_locked_memory(monkeypatch, caplog):
    fake, fallbacks, cleared = FakeCudart(fail_with=2), [], []
    monkeypatch.setattr(torch.cuda, "cudart", lambda: fake)
    monkeypatch.setattr(host_memory, "clear_cuda_last_error", lambda: cleared.append(1) or True)
    # torch's page-locked allocator needs a GPU: a plain tensor stands in for it here
    monkeypatch.setattr(host_memory, "_torch_pinned_zeros",
                        lambda shape, dtype: fallbacks.append(shape) or torch.zeros(shape, dtype=dtype))
    with caplog.at_level("WARNING", logger="scout_sglang.cpu_worker"):
        t, buffer = alloc_host_buffer(ODD_SHAPE, torch.bfloat16, device="cuda", what="the host K/V store")
    (_, address, nbytes, _), = fake.of("register")
    assert fallbacks == [ODD_SHAPE] and t.shape == ODD_SHAPE and torch.count_nonzero(t) == 0
    assert buffer.kind == "pinned (torch)" and not buffer.registered and buffer.address == t.data_ptr()
    assert cleared, "the failure must not stay CUDA's last error for torch's next launch check to raise"
    warning, = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warning.startswith(f"cudaHostRegister of the host K/V store (2.0 MiB at {address:#x}) failed with CUDA "
                              "error 2 (fake error 2): it comes from torch's page-locked allocator instead")
    assert not mapped(address, nbytes), "the mapping is given back before torch allocates the memory again"
    del t
    gc.collect()
    assert fake.of("unregister") == []


def test_nothing_calls_cuda_for_a_cpu_buffer(monkeypatch):
    def no_cuda():
        raise AssertionError("CUDA was called for a CPU device")

    monkeypatch.setattr(torch.cuda, "cudart", no_cuda)
    t, buffer = alloc_host_buffer(SHAPE, torch.bfloat16, device="cpu")
    report = page_report(buffers_of([t]))
    assert not buffer.registered and report["kind"] == buffer.kind == ("thp" if huge_pages_allowed() else "4k")
    assert report["resident_bytes"] == 0, "a CPU device's buffer is not pre-faulted"
    t.fill_(1.0)
    assert page_report([buffer])["resident_bytes"] == buffer.nbytes
    del t
    gc.collect()


def test_without_populate_write_every_page_is_touched(monkeypatch):
    monkeypatch.setattr(host_memory, "MADV_POPULATE_WRITE", 0x7FFF)  # what a kernel before 5.14 answers: EINVAL
    t, buffer = alloc_host_buffer(ODD_SHAPE, torch.bfloat16, populate=True)
    resident, huge = measured(buffer)
    assert resident == buffer.nbytes and torch.count_nonzero(t) == 0
    if huge_pages_allowed():
        assert huge >= 0.9 * buffer.nbytes


def test_a_page_report_counts_each_buffer_only_within_its_own_range():
    if not huge_pages_allowed():
        pytest.skip(f"transparent huge pages are {thp_state()} here")
    tensors = [alloc_host_buffer(SHAPE, torch.bfloat16, populate=True) for _ in range(3)]
    first = page_report([tensors[0][1]])
    assert first["bytes"] == first["huge_page_bytes"] == first["resident_bytes"] == 8 << 20  # not its neighbours'
    assert first["huge_page_share"] == 1.0 and first["kinds"] == {"thp": 8 << 20}
    both = page_report([b for _, b in tensors])
    assert both["bytes"] == both["huge_page_bytes"] == 24 << 20 and both["kind"] == "thp"


def test_register_page_locked_registers_each_allocation_once_and_raises_when_it_fails(cudart):
    ours, buffer = alloc_host_buffer(SHAPE, torch.bfloat16)  # allocated for the CPU, registered afterwards
    theirs = torch.zeros(4, 1024)
    register_page_locked([ours[0], ours[1:], theirs.view(-1), theirs[1]], what="the arrival pool")
    assert cudart.of("register") == [("register", ours.data_ptr(), buffer.nbytes, 0),
                                     ("register", theirs.data_ptr(), theirs.numel() * 4, 0)]
    assert buffer.kind == "thp+registered" if huge_pages_allowed() else buffer.kind == "4k+registered"
    assert [b.kind for b in buffers_of([theirs, ours])] == ["other+registered", buffer.kind]
    register_page_locked([ours], what="the arrival pool")  # registered already: nothing
    assert len(cudart.of("register")) == 2
    del ours, theirs
    gc.collect()
    assert sorted(call[1] for call in cudart.of("unregister")) == sorted(call[1] for call in cudart.of("register"))
    cudart.fail_with = 2
    with pytest.raises(RuntimeError, match=r"cudaHostRegister of the arrival pool \(.*\) failed with CUDA error 2"):
        register_page_locked([torch.zeros(8)], what="the arrival pool")
