"""Lets SGLang's Mooncake transfer backend send K/V from a CPU-only prefill server.

SGLang 0.5.23's MooncakeKVSender says it supports host tensor indices, so the
prefill side pins a host tensor (pin_memory=True) at the first send, which needs
a CUDA (or other accelerator) backend and fails on a CPU-only machine. With the
flag off the sender takes its plain path, which works on the CPU.

Loaded at interpreter start by scout_cpu_serving_pd.pth in the CPU serving
environment only (a GPU deployment never gets it); it changes that one class
attribute when sglang's Mooncake module is first imported, and nothing else.
"""

import importlib.abc
import importlib.util
import sys

MODULE = "sglang.srt.disaggregation.mooncake.conn"


def _patch(module) -> None:
    module.MooncakeKVSender.supports_host_tensor_indices = False


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _patch(module)


class _AfterMooncakeConn(importlib.abc.MetaPathFinder):
    """Wraps the loader of MODULE so that _patch runs right after the module executes."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _PatchingLoader(spec.loader)
        return spec


if MODULE in sys.modules:
    _patch(sys.modules[MODULE])
else:
    sys.meta_path.insert(0, _AfterMooncakeConn())
