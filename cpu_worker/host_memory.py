"""Host memory for the bulk buffers the CPU workers read: the K/V store, on 2 MiB pages, page-locked in place on CUDA.

Why: the CPU part reads randomly placed 8 KiB blocks from a store of many GiB.
With 4 KiB pages every block touches two pages and the TLB reach (a few MiB)
covers a tiny part of the store, so most block reads start with a page walk;
2 MiB pages cut the walks 512-fold (1.34-1.84x on the kernel,
benchmarks/results/cpu_attention.md). Linux gives anonymous memory huge pages
when /sys/kernel/mm/transparent_hugepage/enabled is "always", or "madvise" and
the range was madvise(MADV_HUGEPAGE)d; "never" (or a non-Linux host) gives
none, and the store works the same, only slower.

`alloc_host_buffer` is the one allocator: an anonymous mmap, 2 MiB aligned and
madvised before first touch; for a CUDA device it is pre-faulted and then
page-locked in place with cudaHostRegister at its exact size, so recall copies
run on the stream and the GPU kernels read it through unified addressing.
torch's page-locked allocator would give 4 KiB pages and round each buffer up
to a power of two (up to half the host memory that is the product's capacity);
it is only the fallback when cudaHostRegister fails. Each buffer's HostBuffer
record unregisters it when its memory is freed, before the unmap.
`page_report` says which kind each buffer got and measures the share of its
bytes on 2 MiB pages (/proc/self/smaps). `zeros_on_huge_pages` gives someone
else's constructor (SGLang's host KV pool, which the engine borrows as its
store on a PD decode instance) its large buffers from the same allocator.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import logging
import mmap
import os
import re
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from scout_sglang.cpu_worker.cpu_sets import process_cpus

logger = logging.getLogger("scout_sglang.cpu_worker")

HUGE_PAGE_BYTES = 2 << 20
PAGE_BYTES = mmap.PAGESIZE
THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")
SMAPS = Path("/proc/self/smaps")
# Linux madvise values (Python's mmap module names only some of them, and only on Linux).
MADV_HUGEPAGE = 14
MADV_NOHUGEPAGE = 15
MADV_POPULATE_WRITE = 23  # Linux 5.14+: fault a range in for writing in one call; EINVAL before
POPULATE_CHUNK_BYTES = 1 << 30  # a store is pre-faulted in chunks of 1 GiB by up to POPULATE_THREADS threads
POPULATE_THREADS = 8
# cudaHostRegisterDefault: on a system with unified virtual addressing (every 64-bit CUDA platform) the memory is
# both mapped (a kernel reads it at its host address) and portable (every context sees it page-locked).
CUDA_HOST_REGISTER_DEFAULT = 0

# The page kind of a buffer, as logs and reports name it.
PAGE_KINDS = {
    "thp+registered": "2 MiB-aligned, madvised for huge pages, pre-faulted, page-locked in place (cudaHostRegister)",
    "thp": "2 MiB-aligned, madvised for huge pages; pages fault in on first write",
    "4k+registered": "4 KiB pages (huge pages unavailable, or a buffer under 2 MiB), pre-faulted, page-locked in "
                     "place (cudaHostRegister)",
    "4k": "4 KiB pages (huge pages unavailable or not asked for, or a buffer under 2 MiB)",
    "pinned (torch)": "torch's page-locked allocator: 4 KiB pages, the size rounded up to a power of two "
                      "(cudaHostRegister failed)",
    "other": "memory allocated elsewhere (a borrowed buffer)",
    "other+registered": "memory allocated elsewhere, page-locked in place (cudaHostRegister)",
}


def thp_state(path: Path = THP_ENABLED) -> str:
    """The bracketed THP mode ("always", "madvise", "never"), or "unavailable"."""
    try:
        match = re.search(r"\[(\w+)\]", path.read_text())
    except OSError:
        return "unavailable"
    return match.group(1) if match else "unavailable"


@dataclass(eq=False)
class HostBuffer:
    """One bulk host buffer: where its memory is, its size, which pages it got and whether CUDA page-locked it.

    pages : "thp", "4k", "pinned (torch)" or "other" (memory this module did not allocate); `kind` adds
        "+registered" while cudaHostRegister holds it (PAGE_KINDS)
    """

    address: int
    nbytes: int
    pages: str
    what: str = "host buffer"
    _cudart: object = field(default=None, repr=False)  # the runtime that registered it: it unregisters it

    @property
    def registered(self) -> bool:
        return self._cudart is not None

    @property
    def kind(self) -> str:
        return f"{self.pages}+registered" if self.registered else self.pages

    def register(self, cudart) -> int:
        """cudaHostRegister of exactly [address, address + nbytes); returns the CUDA error code (0: success)."""
        error = cudart.cudaHostRegister(self.address, self.nbytes, CUDA_HOST_REGISTER_DEFAULT)
        if int(error) == 0:
            self._cudart = cudart
        else:
            clear_cuda_last_error()
        return int(error)

    def unregister(self) -> None:
        """cudaHostUnregister, once (the engine's close() and the buffer's finalizer both call it)."""
        cudart, self._cudart = self._cudart, None
        if cudart is None:
            return
        error = int(cudart.cudaHostUnregister(self.address))
        if error:
            clear_cuda_last_error()
            logger.warning("cudaHostUnregister of %s (%s at %#x) failed with CUDA error %d%s", self.what,
                           _size_text(self.nbytes), self.address, error, _error_name(cudart, error))


# Live buffers of this module by address: a store borrowed from another owner (the arrival pool) is described and
# registered through the record its allocation made. An entry leaves when its memory is freed (_release).
_live: dict[int, HostBuffer] = {}


def _release(buffer: HostBuffer, region) -> None:
    """Finalizer of a mapped buffer, run when the last tensor over it is freed. `region` (the mmap) is an argument
    so that it outlives this call: the unmap comes after the unregister."""
    buffer.unregister()
    if _live.get(buffer.address) is buffer:
        del _live[buffer.address]
    del region


def alloc_host_buffer(shape, dtype: torch.dtype, *, device="cpu", huge_pages: bool = True,
                      populate: bool | None = None, what: str = "host buffer") -> tuple[torch.Tensor, HostBuffer]:
    """A zeroed CPU tensor of `shape` / `dtype` for bulk reads by the CPU workers, and its HostBuffer record.

    Parameters
    ----------
    device : the device the buffer serves. CUDA: pre-faulted, then page-locked in place with cudaHostRegister at
        its exact size (unregistered when freed); if registration fails, a warning says what failed and the
        buffer comes from torch's page-locked allocator instead. CPU: nothing calls CUDA.
    huge_pages : madvise the mapping for transparent huge pages (when the THP mode allows and the buffer holds at
        least one); False asks for 4 KiB pages (MADV_NOHUGEPAGE)
    populate : fault every page in now; default: only for a CUDA device (registration needs the pages resident).
        On a CPU device the pages fault in, as huge pages, where blocks are first written: pre-faulting a store
        sized to most of the host's memory would cost seconds to minutes of start-up and commit memory that a
        capacity not yet used does not need.
    what : names the buffer in logs

    The tensor shares memory with an anonymous mmap that lives as long as the tensor (or a view of it) does.
    """
    numel = int(np.prod(shape, dtype=np.int64)) if len(shape) else 1
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    cuda = torch.device(device).type == "cuda"
    populate = cuda if populate is None else populate
    if nbytes == 0:
        tensor = torch.zeros(shape, dtype=dtype)
        return tensor, HostBuffer(tensor.data_ptr(), 0, "4k", what)
    huge = huge_pages and thp_state() in ("always", "madvise") and nbytes >= HUGE_PAGE_BYTES
    # Whole pages of the kind asked; a huge-page mapping has 2 MiB of slack so that its start can be 2 MiB aligned.
    # The slack is never touched (no memory) and never madvised: it keeps the kernel from merging two of these
    # mappings into one, which smaps would count together (page_report).
    span = -(-nbytes // (HUGE_PAGE_BYTES if huge else PAGE_BYTES)) * (HUGE_PAGE_BYTES if huge else PAGE_BYTES)
    region = mmap.mmap(-1, span + (HUGE_PAGE_BYTES if huge else 0), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    raw = np.frombuffer(region, dtype=np.uint8)
    offset = (-raw.ctypes.data) % HUGE_PAGE_BYTES if huge else 0
    address = raw.ctypes.data + offset
    if huge and _madvise(address, span, MADV_HUGEPAGE):
        huge = False  # madvise refused (a kernel without THP): 4 KiB pages
    elif not huge_pages and nbytes >= HUGE_PAGE_BYTES:
        _madvise(address, span, MADV_NOHUGEPAGE)  # THP "always" would give huge pages unasked
    if populate:
        # Faulting in the partial last huge page makes it whole: up to 2 MiB beyond nbytes, the alignment's cost.
        _populate(raw, offset, -(-nbytes // PAGE_BYTES) * PAGE_BYTES)
    buffer = HostBuffer(address, nbytes, "thp" if huge else "4k", what)
    if cuda:
        error = _register(buffer)
        if error:
            logger.warning("cudaHostRegister of %s (%s at %#x) failed with %s: it comes from torch's page-locked "
                           "allocator instead (4 KiB pages, its size rounded up to a power of two), so the CPU "
                           "attention reads it slower", what, _size_text(nbytes), address, error)
            del raw
            region.close()  # give the memory back before torch allocates it again
            tensor = _torch_pinned_zeros(shape, dtype)
            return tensor, HostBuffer(tensor.data_ptr(), nbytes, "pinned (torch)", what)
    view = raw[offset: offset + nbytes]  # what torch.frombuffer holds: its finalizer runs when the memory is freed
    tensor = torch.frombuffer(view, dtype=dtype).view(shape)
    weakref.finalize(view, _release, buffer, region).atexit = False  # at exit the process's end frees it all
    _live[address] = buffer
    return tensor, buffer


def _register(buffer: HostBuffer) -> str | None:
    """Page-lock `buffer` with cudaHostRegister; None on success, else what failed, for the warning."""
    try:
        cudart = torch.cuda.cudart()
    except (AssertionError, RuntimeError) as exc:  # torch without CUDA, or a CUDA that cannot initialise here
        return f"no CUDA runtime ({exc})"
    error = buffer.register(cudart)
    return f"CUDA error {error}{_error_name(cudart, error)}" if error else None


def _torch_pinned_zeros(shape, dtype: torch.dtype) -> torch.Tensor:
    """The fallback after a failed cudaHostRegister: torch's page-locked allocator."""
    return torch.zeros(shape, dtype=dtype, pin_memory=True)


def _error_name(cudart, error: int) -> str:
    """" (<CUDA's name of the error>)", as torch.cuda.CudaError spells it; "" when the runtime cannot say."""
    try:
        code = cudart.cudaError(error) if hasattr(cudart, "cudaError") else error  # torch's binding takes its enum
        return f" ({cudart.cudaGetErrorString(code)})"
    except (AttributeError, TypeError, ValueError, RuntimeError):
        return ""


def clear_cuda_last_error() -> bool:
    """Reset the CUDA runtime's last error after a failed call of ours; returns whether it could.

    A failed cudaHostRegister stays the thread's last error, which torch reads after its next kernel launch
    (C10_CUDA_KERNEL_LAUNCH_CHECK) and would raise there, failing a server that had fallen back. torch does not bind
    cudaGetLastError, so it is called in the libcudart this process already loaded (none loaded: nothing to clear).
    """
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return False
    cleared = False
    for path in sorted({line.split()[-1] for line in maps.splitlines() if "libcudart.so" in line.rsplit("/", 1)[-1]}):
        try:
            ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY).cudaGetLastError()
            cleared = True
        except (OSError, AttributeError):  # not a loaded library after all, or no such symbol
            continue
    return cleared


@functools.cache
def _libc_madvise():
    try:
        function = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    function.argtypes, function.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return function


def _madvise(address: int, length: int, advice: int) -> int:
    """madvise(2) by address (the call releases the GIL); returns errno, 0 on success."""
    function = _libc_madvise()
    if function is None:
        return errno.ENOSYS
    return 0 if function(address, length, advice) == 0 else ctypes.get_errno()


def _populate(raw: np.ndarray, start: int, length: int) -> None:
    """Fault raw[start:start + length] in for writing, in chunks on up to POPULATE_THREADS threads:
    MADV_POPULATE_WRITE, or where the kernel predates it (EINVAL) a write per page. Memory the kernel cannot give
    raises OSError here rather than a SIGBUS or the OOM killer later."""
    base = raw.ctypes.data

    def one(chunk_start: int) -> None:
        end = min(chunk_start + POPULATE_CHUNK_BYTES, start + length)
        error = _madvise(base + chunk_start, end - chunk_start, MADV_POPULATE_WRITE)
        if error in (errno.EINVAL, errno.ENOSYS):
            # One write per 2 MiB first (each faults in a whole huge page where THP allows), then one per 4 KiB
            # page for whatever fell back to small pages. The memory is zero: writing zero keeps it so.
            raw[chunk_start:end:HUGE_PAGE_BYTES] = 0
            raw[chunk_start:end:PAGE_BYTES] = 0
        elif error:
            raise OSError(error, f"pre-faulting {_size_text(end - chunk_start)} of host memory failed: "
                                 f"{os.strerror(error)}")

    chunks = range(start, start + length, POPULATE_CHUNK_BYTES)
    cpus = process_cpus()  # not the caller's: a core plan may have put it on its host core alone
    workers = min(len(chunks), POPULATE_THREADS, len(cpus))
    if workers <= 1:
        for chunk_start in chunks:
            one(chunk_start)
        return
    with ThreadPoolExecutor(workers, thread_name_prefix="scout-populate",
                            initializer=lambda: os.sched_setaffinity(0, cpus)) as pool:
        list(pool.map(one, chunks))


def register_page_locked(tensors, *, what: str = "host memory") -> None:
    """Page-lock the host memory under `tensors` in place for CUDA, each allocation once, until it is freed.

    Memory from alloc_host_buffer is registered through its record (unregistered before it is unmapped); memory
    allocated elsewhere is unregistered when its storage is freed, as torch's own pinning helper does
    (torch.cuda._pin_memory_utils). Memory already page-locked is left as it is. Raises RuntimeError when
    registration fails: the memory's owner holds it, so there is nothing to fall back to (alloc_host_buffer,
    which allocates, falls back to torch's allocator instead).
    """
    cudart, done = torch.cuda.cudart(), set()
    for tensor in tensors:
        storage = tensor.untyped_storage()
        address, nbytes = storage.data_ptr(), storage.nbytes()
        if address in done:
            continue
        done.add(address)
        buffer = _live.get(address)
        if buffer is None:
            if tensor.is_pinned():
                continue
            buffer = HostBuffer(address, nbytes, "other", what)
        if buffer.registered or buffer.pages == "pinned (torch)":
            continue
        error = buffer.register(cudart)
        if error:
            raise RuntimeError(f"cudaHostRegister of {what} ({_size_text(nbytes)} at {address:#x}) failed with CUDA "
                               f"error {error}{_error_name(cudart, error)}: the engine cannot read it on the GPU's "
                               "stream")
        if address not in _live:
            _live[address] = buffer
            weakref.finalize(storage, _release, buffer, None).atexit = False


def buffers_of(tensors, device="cpu") -> list[HostBuffer]:
    """The HostBuffer record of each distinct allocation under `tensors` (a borrowed store's buffers): this
    module's own record where it allocated or registered it, else one that names the memory "pinned (torch)" (on
    a CUDA device, when page-locked) or "other"."""
    buffers, seen = [], set()
    for tensor in tensors:
        storage = tensor.untyped_storage()
        address = storage.data_ptr()
        if address in seen:
            continue
        seen.add(address)
        buffer = _live.get(address)
        if buffer is None:
            pinned = torch.device(device).type == "cuda" and tensor.is_pinned()  # no CUDA call on a CPU device
            buffer = HostBuffer(address, storage.nbytes(), "pinned (torch)" if pinned else "other")
        buffers.append(buffer)
    return buffers


def _smaps_mappings(path: Path = SMAPS):
    """(start, end, {field: kB}) of each mapping in smaps; None when unreadable."""
    try:
        text = path.read_text()
    except OSError:
        return None
    mappings = []
    for line in text.splitlines():
        head = line.split(" ", 1)[0]
        if "-" in head and all(c in "0123456789abcdef-" for c in head):
            lo, hi = (int(x, 16) for x in head.split("-"))
            mappings.append((lo, hi, {}))
        elif mappings and line.endswith(" kB"):
            name, value = line.split(":", 1)
            mappings[-1][2][name] = int(value.split()[0])
    return mappings


def anon_huge_kib(ranges: list[tuple[int, int]]) -> int | None:
    """KiB on huge pages (smaps AnonHugePages) of the mappings that hold any of `ranges` ((address, nbytes)).

    smaps counts per mapping, and the kernel merges adjacent anonymous mappings, so this may include
    neighbouring memory: callers cap the share at 1 (page_report caps each mapping at its overlap). None when
    smaps is unreadable.
    """
    mappings = _smaps_mappings()
    if mappings is None:
        return None
    return sum(fields.get("AnonHugePages", 0) for lo, hi, fields in mappings
               if any(lo < address + nbytes and hi > address for address, nbytes in ranges))


def smaps_bytes(ranges: list[tuple[int, int]]) -> tuple[int, int] | None:
    """(resident bytes, bytes on huge pages) of the disjoint address ranges (address, nbytes), from smaps.

    smaps counts per mapping, and the kernel merges adjacent anonymous mappings of the same flags, so a mapping
    may also hold memory outside the ranges: each mapping's Rss and AnonHugePages are capped at its overlap with
    the ranges. alloc_host_buffer's huge-page buffers are not merged with each other (an unadvised gap follows
    each); a neighbour madvised by someone else could still be, and would then count at most its overlap. None
    when smaps is unreadable.
    """
    mappings = _smaps_mappings()
    if mappings is None:
        return None
    resident = huge = 0
    for lo, hi, fields in mappings:
        overlap = sum(max(0, min(hi, address + nbytes) - max(lo, address)) for address, nbytes in ranges)
        if overlap:
            resident += min(fields.get("Rss", 0) * 1024, overlap)
            huge += min(fields.get("AnonHugePages", 0) * 1024, overlap)
    return resident, huge


def page_report(buffers: list[HostBuffer], measured: tuple[int, int] | None = None) -> dict:
    """Which pages `buffers` got: the fields of /server_info's `host_store_pages` (docs/deployment.md).

    kind: the page kind of every buffer (PAGE_KINDS), "mixed" when they differ, "none" without buffers; kinds:
    bytes per kind; bytes: their size; resident_bytes / huge_page_bytes: of those, resident now and on 2 MiB pages
    (`measured`, default: read from smaps now; null when unreadable); huge_page_share: huge_page_bytes / bytes;
    thp: the system's THP mode.
    """
    kinds: dict[str, int] = {}
    for buffer in buffers:
        kinds[buffer.kind] = kinds.get(buffer.kind, 0) + buffer.nbytes
    total = sum(kinds.values())
    if measured is None:
        measured = smaps_bytes([(b.address, b.nbytes) for b in buffers if b.nbytes]) if total else (0, 0)
    resident, huge = measured if measured is not None else (None, None)
    return {
        "kind": next(iter(kinds)) if len(kinds) == 1 else ("mixed" if kinds else "none"),
        "kinds": kinds,
        "bytes": total,
        "resident_bytes": resident,
        "huge_page_bytes": huge,
        "huge_page_share": round(huge / total, 4) if huge is not None and total else None,
        "thp": thp_state(),
    }


class PageSurvey:
    """page_report of a fixed set of buffers, whose smaps measurement is read again at most every `max_age_s`
    seconds (a read walks every mapping of the process: too slow for each metrics update), and never again once
    every buffer is page-locked (pinned pages neither fault in nor split nor collapse)."""

    def __init__(self, buffers: list[HostBuffer]):
        self.buffers = buffers
        self._measured: tuple[int, int] | None = None
        self._at = float("-inf")
        self._fixed = False

    def report(self, max_age_s: float = 0.0) -> dict:
        now = time.monotonic()
        if not self._fixed and now - self._at > max_age_s:
            ranges = [(b.address, b.nbytes) for b in self.buffers if b.nbytes]
            self._measured = smaps_bytes(ranges) if ranges else (0, 0)
            self._at = now
            self._fixed = self._measured is not None and bool(ranges) and all(b.registered for b in self.buffers)
        return page_report(self.buffers, self._measured or (None, None))  # (None, None): smaps unreadable


def page_text(report: dict) -> str:
    """A page_report for a log line: "thp+registered, 99.8% of 4.00 GiB on 2 MiB pages"."""
    if not report["bytes"]:
        return "none"
    if report["huge_page_share"] is None:
        return f"{report['kind']}, {_size_text(report['bytes'])} (smaps unreadable: huge pages not measured)"
    text = f"{report['kind']}, {100 * report['huge_page_share']:.1f}% of {_size_text(report['bytes'])} on 2 MiB pages"
    if report["resident_bytes"] < report["bytes"] // 2:
        text += f" ({100 * report['resident_bytes'] / report['bytes']:.1f}% resident: pages fault in as written)"
    return text


def _size_text(num_bytes: float) -> str:
    return f"{num_bytes / 2**30:.2f} GiB" if num_bytes >= 2**30 else f"{num_bytes / 2**20:.1f} MiB"


def alloc_host_tensor(shape, dtype: torch.dtype, *, huge_pages: bool = True) -> tuple[torch.Tensor, str]:
    """A zeroed CPU tensor of `shape` / `dtype` on huge pages where allowed, for CPU-only readers, and its page
    kind ("thp" or "4k"): alloc_host_buffer for the CPU device, not pre-faulted."""
    tensor, buffer = alloc_host_buffer(shape, dtype, huge_pages=huge_pages)
    return tensor, buffer.kind


_logged_kinds: set[tuple[str, str]] = set()


def alloc_store_tensor(shape, dtype: torch.dtype, *, device) -> tuple[torch.Tensor, HostBuffer]:
    """A host K/V store tensor for an engine on `device` (alloc_host_buffer: on CUDA page-locked in place) and its
    record. Logs the page kind and the share of the buffer on 2 MiB pages once per (THP mode, kind), so the
    start-up log says what the store got."""
    tensor, buffer = alloc_host_buffer(shape, dtype, device=device, what="the host K/V store")
    key = (thp_state(), buffer.kind)
    if key not in _logged_kinds:
        _logged_kinds.add(key)
        logger.info("host K/V store pages: %s, first buffer: %s (transparent huge pages: %s)", buffer.kind,
                    page_text(page_report([buffer])), key[0])
    return tensor, buffer


@contextlib.contextmanager
def zeros_on_huge_pages(what: str, device="cpu"):
    """Within the block, torch.zeros(size, dtype=..., device="cpu") of at least a huge page comes from
    alloc_host_buffer for `device` (zeroed, madvised before first touch; for a CUDA device pre-faulted and
    page-locked in place); any other call is torch's own. For a constructor that allocates its buffers with
    torch.zeros and no other options. Logs the page kind `what` got, once per (THP mode, kind)."""
    original, buffers, serves = torch.zeros, [], device

    def zeros(*size, dtype=None, device=None, **options):
        shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)) else size
        if options or torch.device(device or "cpu").type != "cpu" or not all(isinstance(n, int) for n in shape):
            return original(*size, dtype=dtype, device=device, **options)
        dtype = dtype or torch.get_default_dtype()
        if int(np.prod(shape, dtype=np.int64)) * torch.empty((), dtype=dtype).element_size() < HUGE_PAGE_BYTES:
            return original(*size, dtype=dtype, device=device)
        tensor, buffer = alloc_host_buffer(shape, dtype, device=serves, what=what)
        buffers.append(buffer)
        return tensor

    torch.zeros = zeros
    try:
        yield
    finally:
        torch.zeros = original
    for kind in sorted({buffer.kind for buffer in buffers}):
        key = (thp_state(), f"{what}: {kind}")
        if key not in _logged_kinds:
            _logged_kinds.add(key)
            logger.info("%s pages: %s (transparent huge pages: %s)", what,
                        page_text(page_report([b for b in buffers if b.kind == kind])), key[0])
