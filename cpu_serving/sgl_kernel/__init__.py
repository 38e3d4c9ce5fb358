"""Pure-torch stand-in for sgl-kernel on CPU-only test machines (see ../README.md).

Only the two ops the CPU server calls without the AMX backend are real; any
other name resolves to a stub that raises NotImplementedError when called, so
modules that import it at top level still load.
"""

from __future__ import annotations

import ctypes
import sys
import types

import torch


def assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, max_len):
    """req_to_token[r, start:end] = the next (end - start) entries of out_cache_loc, per request."""
    offset = 0
    for r, start, end in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist()):
        length = end - start
        req_to_token[r, start:end] = out_cache_loc[offset : offset + length].to(req_to_token.dtype)
        offset += length


def copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt_loc, src_loc):
    """For every buffer (raw pointer + row stride in bytes) copy row src_loc[i] to tgt_loc[i]."""
    pairs = list(zip(tgt_loc.tolist(), src_loc.tolist()))
    for pointer, stride in zip(data_ptrs.tolist(), strides.tolist()):
        for target, source in pairs:
            ctypes.memmove(pointer + target * stride, pointer + source * stride, stride)


class _Stub:
    """A missing sgl_kernel name: attributes are stubs too (module-level constants
    such as scalar_types.uint4b8 are read at import time); calling raises."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attribute: str):
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        return _Stub(f"{self._name}.{attribute}")

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(f"sgl_kernel.{self._name} is not available in the CPU test stand-in")

    def __repr__(self) -> str:
        return f"<sgl_kernel stand-in stub {self._name}>"


def _stub(name: str) -> _Stub:
    return _Stub(name)


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    return _stub(name)


class _StubModule(types.ModuleType):
    """Submodules such as sgl_kernel.kvcacheio: every name is a stub."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _stub(f"{self.__name__.split('.', 1)[1]}.{name}")


class _StubFinder:
    """Makes `import sgl_kernel.<anything>` succeed with a stub module."""

    @staticmethod
    def find_spec(fullname, path=None, target=None):
        if not fullname.startswith("sgl_kernel."):
            return None
        from importlib.machinery import ModuleSpec

        return ModuleSpec(fullname, _StubLoader(), is_package=True)


class _StubLoader:
    @staticmethod
    def create_module(spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    @staticmethod
    def exec_module(module):
        return None


sys.meta_path.append(_StubFinder())
__version__ = "0.0.0+cpu-standin"
_ = torch  # torch must be importable where the stand-in is used
