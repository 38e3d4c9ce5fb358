"""Build, load and call the native CPU attention kernel (native/scout_cpu_attention.cpp).

The .cpp is the torch binding; the kernels are the headers next to it
(native/*.h), found by its quoted #includes and compiled into the one
translation unit.

The fast path of the CPU part: built on first use with torch's cpp_extension
for this host (-O3 -march=native), once per process under a lock, and cached
on disk: in <SCOUT_NATIVE_BUILD_DIR>/<name> when that is set (read by
scout_sglang.env), else in torch's extension cache. Processes that build the
same name take turns under an flock, which dies with its holder: a build that
was killed mid-way (its torch `lock` file left behind, on which torch would
wait forever) is cleared by the next builder. A build that fails (no
compiler, compile error) is reported once through logging and leaves the torch
path (torch_kernel.py) to serve; a bad SCOUT_NATIVE_BUILD_DIR is an error.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import logging
import platform
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

logger = logging.getLogger("scout_sglang.cpu_worker")

NATIVE_DIR = Path(__file__).parent / "native"
SOURCES = (NATIVE_DIR / "scout_cpu_attention.cpp",)
EXTRA_CFLAGS = ("-O3", "-march=native")
_BUILD_LOCK = threading.Lock()


@dataclass(frozen=True)
class NativeBuild:
    """Outcome of a build: the loaded module, or why there is none."""

    module: object | None
    name: str
    error: str | None = None


def host_key() -> str:
    """Short hash of this CPU's feature flags.

    -march=native binaries are host specific; keying the extension name by the
    flags keeps a shared torch_extensions cache from serving a binary built on
    another CPU (SIGILL).
    """
    flags = platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                flags += " ".join(sorted(line.split(":", 1)[1].split()))
                break
    except OSError:
        pass
    return hashlib.sha1(flags.encode()).hexdigest()[:8]


def headers_key(sources: tuple[Path, ...]) -> str:
    """Short hash of the names and content of the headers (*.h) beside `sources`.

    torch keys its extension cache by the content of the sources it compiles,
    which leaves out the headers they include; with this key in the extension
    name, an edited header gets a build of its own.
    """
    digest = hashlib.sha1()
    for folder in sorted({Path(s).parent for s in sources}):
        for header in sorted(folder.glob("*.h")):
            digest.update(header.name.encode() + b"\0" + header.read_bytes() + b"\0")
    return digest.hexdigest()[:8]


def build_native(
    *, name: str | None = None, sources: tuple[Path, ...] = SOURCES, extra_cflags: tuple[str, ...] = EXTRA_CFLAGS,
    build_dir: Path | None = None,
) -> NativeBuild:
    """Compile and import the kernel; never raises (errors come back in the result).

    build_dir: the kernel is built and cached in build_dir/<name> (a folder per name, so that builds for
    other hosts or headers never overwrite each other); None: torch's extension cache.
    """
    name = name or f"scout_cpu_attention_{host_key()}_{headers_key(sources)}"
    try:
        from torch.utils.cpp_extension import load

        directory = _build_directory(name, build_dir)
        with _exclusive_build(directory):
            module = load(name=name, sources=[str(s) for s in sources], extra_cflags=list(extra_cflags),
                          verbose=False, build_directory=str(directory))
    except Exception as exc:  # noqa: BLE001 - any build failure means "use the torch path"
        first_line = (str(exc).strip().splitlines() or [""])[0]
        return NativeBuild(module=None, name=name, error=f"{type(exc).__name__}: {first_line[:500]}")
    return NativeBuild(module=module, name=name)


def _build_directory(name: str, build_dir: Path | None) -> Path:
    if build_dir is None:
        from torch.utils.cpp_extension import _get_build_directory  # torch's cache root, with its rules

        return Path(_get_build_directory(name, False))
    directory = Path(build_dir) / name
    directory.mkdir(parents=True, exist_ok=True)
    return directory


@contextlib.contextmanager
def _exclusive_build(directory: Path):
    """Hold the build of `directory` against other processes; clear a killed build's torch lock.

    torch marks a build in progress with a `lock` file and makes every other loader wait while it exists,
    so a build killed mid-way (a server stopped during its first start, a timed-out job) would hang every
    later start. The flock taken here is released by the kernel when its holder dies: whoever holds it is
    the only builder, and a `lock` file it finds is a dead build's.
    """
    with open(directory / "scout-build.flock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        stale = directory / "lock"
        if stale.exists():
            logger.warning("removing %s left by a build that did not finish", stale)
            stale.unlink(missing_ok=True)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@functools.cache
def _load_native_once(build_dir: Path | None) -> NativeBuild:
    build = build_native(build_dir=build_dir)
    if build.module is None:
        logger.warning("native CPU attention kernel unavailable, the torch path will serve: %s", build.error)
    else:
        logger.info("native CPU attention kernel %s loaded from %s (isa %s)", build.name,
                    build.module.__file__, build.module.isa())
    return build


def load_native() -> NativeBuild:
    """The process-wide build: compiled once (concurrent callers wait for it).

    Raises ValueError for a bad SCOUT_NATIVE_BUILD_DIR: a setting that names a directory that cannot be
    used must stop the caller, not quietly leave the torch path to serve.
    """
    from scout_sglang.env import native_build_dir  # environment variables are read there only

    build_dir = native_build_dir()
    with _BUILD_LOCK:
        return _load_native_once(build_dir)


class NativeKernel:
    """Host wrapper of the native kernel; it validates nothing: its callers build or check the inputs
    (FlagWorker checks each row's block lists, checks.py; the measurements of plan/measure.py build their own).

    `decode` attends sequence `batch_index` over KV heads [head_begin,
    head_end), taking split `split_index` of `num_splits` of each head's block
    list, and writes o [Hq, D] / lse [Hq] (natural log) rows of those heads to
    out_o[out_index] / out_lse[out_index]. The GIL is released inside.
    """

    name = "native"

    def __init__(self, module: object):
        self._decode = module.decode
        self.isa = module.isa()

    def new_scratch(self) -> None:
        """Per-thread scratch lives inside the kernel (thread_local)."""
        return None

    def decode(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_table: torch.Tensor,
        counts: torch.Tensor,
        *,
        batch_index: int,
        out_o: torch.Tensor,
        out_lse: torch.Tensor,
        out_index: int,
        scale: float,
        head_begin: int,
        head_end: int,
        split_index: int,
        num_splits: int,
        scratch: None,
    ) -> None:
        # The binding is positional; this is the one place that spells the order.
        self._decode(
            q, k_cache, v_cache, block_table, counts, batch_index, out_o, out_lse, out_index,
            scale, head_begin, head_end, split_index, num_splits,
        )  # fmt: skip
