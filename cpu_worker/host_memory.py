"""Host K/V store memory backed by transparent huge pages where the OS allows.

Why: the CPU part reads randomly placed 8 KiB blocks from a store of many GiB.
With 4 KiB pages every block touches two pages and the TLB reach (a few MiB)
covers a tiny part of the store, so most block reads start with a page walk;
2 MiB pages cut the walks 512-fold. Linux gives anonymous memory huge pages
when /sys/kernel/mm/transparent_hugepage/enabled is "always", or "madvise" and
the range was madvise(MADV_HUGEPAGE)d; "never" (or a non-Linux host) gives
none, and the store works the same, only slower.

`alloc_host_tensor` maps the memory itself (anonymous mmap, 2 MiB aligned,
madvised before first touch) and wraps it in a tensor that keeps the mapping
alive; `zeros_on_huge_pages` makes someone else's constructor (SGLang's host
KV pool, which the engine borrows as its store on a PD decode instance) get its
large buffers that way; `thp_state` reports the system setting for the start-up
log and the benchmark.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import re
from pathlib import Path

import numpy as np
import torch

logger = logging.getLogger("scout_sglang.cpu_worker")

HUGE_PAGE_BYTES = 2 << 20
THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")
MADV_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", 14)  # Linux value; Python exposes it on Linux only


def thp_state(path: Path = THP_ENABLED) -> str:
    """The bracketed THP mode ("always", "madvise", "never"), or "unavailable"."""
    try:
        match = re.search(r"\[(\w+)\]", path.read_text())
    except OSError:
        return "unavailable"
    return match.group(1) if match else "unavailable"


def anon_huge_kib(ranges: list[tuple[int, int]]) -> int | None:
    """KiB on huge pages (smaps AnonHugePages) of the mappings that hold any of `ranges` ((address, nbytes)).

    smaps counts per mapping, and the kernel merges adjacent anonymous mappings, so this may include
    neighbouring memory: callers cap the share at 1. None when smaps is unreadable.
    """
    try:
        text = Path("/proc/self/smaps").read_text()
    except OSError:
        return None
    total, inside = 0, False
    for line in text.splitlines():
        head = line.split(" ", 1)[0]
        if "-" in head and all(c in "0123456789abcdef-" for c in head):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = any(lo < address + nbytes and hi > address for address, nbytes in ranges)
        elif inside and line.startswith("AnonHugePages:"):
            total += int(line.split()[1])
    return total


def alloc_host_tensor(shape, dtype: torch.dtype, *, huge_pages: bool = True) -> tuple[torch.Tensor, str]:
    """A zeroed CPU tensor of `shape` / `dtype` and the page kind it asked for.

    Returns (tensor, kind): kind is "thp" when the mapping was madvised for huge pages and the
    system mode allows them ("always" or "madvise"), else "4k". The tensor shares memory with an
    anonymous mmap that stays alive as long as the tensor (or a view of it) does.
    """
    numel = int(np.prod(shape, dtype=np.int64)) if len(shape) else 1
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    state = thp_state()
    want = huge_pages and state in ("always", "madvise") and nbytes >= HUGE_PAGE_BYTES
    if not want:
        return torch.zeros(shape, dtype=dtype), "4k"
    # mmap gives page-aligned memory; a 2 MiB-aligned start lets every 2 MiB of the store be one huge page.
    length = nbytes + HUGE_PAGE_BYTES
    region = mmap.mmap(-1, length, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    raw = np.frombuffer(region, dtype=np.uint8)
    offset = (-raw.ctypes.data) % HUGE_PAGE_BYTES
    try:
        region.madvise(MADV_HUGEPAGE, offset, length - offset - (length - offset) % mmap.PAGESIZE)
    except (AttributeError, OSError, ValueError):
        return torch.zeros(shape, dtype=dtype), "4k"
    # Anonymous memory reads as zero; no fill, so pages fault in (as huge pages) on first write.
    tensor = torch.frombuffer(raw[offset : offset + nbytes], dtype=dtype).view(shape)
    return tensor, "thp"


_logged_kinds: set[tuple[str, str]] = set()


def alloc_store_tensor(shape, dtype: torch.dtype, *, pin: bool) -> torch.Tensor:
    """A host K/V store tensor: page-locked by CUDA's allocator when `pin` (copies to the GPU stay
    async; those pages are not madvised), else on huge pages where allowed. Logs the page kind once
    per (THP mode, kind), so the start-up log says what the store got."""
    if pin:
        tensor, kind = torch.zeros(shape, dtype=dtype, pin_memory=True), "pinned"
    else:
        tensor, kind = alloc_host_tensor(shape, dtype)
    key = (thp_state(), kind)
    if key not in _logged_kinds:
        _logged_kinds.add(key)
        logger.info("host K/V store pages: %s (transparent huge pages: %s)", kind, key[0])
    return tensor


@contextlib.contextmanager
def zeros_on_huge_pages(what: str):
    """Within the block, torch.zeros(size, dtype=..., device="cpu") of at least a huge page comes from
    alloc_host_tensor (zeroed, madvised before first touch); any other call is torch's own. For a constructor
    that allocates its buffers with torch.zeros and no other options. Logs the page kind `what` got, once per
    (THP mode, kind)."""
    original, kinds = torch.zeros, set()

    def zeros(*size, dtype=None, device=None, **options):
        shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)) else size
        if options or torch.device(device or "cpu").type != "cpu" or not all(isinstance(n, int) for n in shape):
            return original(*size, dtype=dtype, device=device, **options)
        tensor, kind = alloc_host_tensor(shape, dtype or torch.get_default_dtype())
        kinds.add(kind)
        return tensor

    torch.zeros = zeros
    try:
        yield
    finally:
        torch.zeros = original
    for kind in sorted(kinds):
        key = (thp_state(), f"{what}: {kind}")
        if key not in _logged_kinds:
            _logged_kinds.add(key)
            logger.info("%s pages: %s (transparent huge pages: %s)", what, kind, key[0])
