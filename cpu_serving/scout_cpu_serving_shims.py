"""Defines the torchvision op schemas before torchvision imports (see README.md).

Loaded at interpreter start by scout_cpu_serving_shims.pth in the serving
environment only. Touches nothing else.
"""

import importlib.abc
import sys


def _define_schemas() -> None:
    from torch import library as torch_library

    try:
        library = torch_library.Library("torchvision", "DEF")
        library.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        library.define("qnms(Tensor qdets, Tensor scores, float iou_threshold) -> Tensor")
        _libraries.append(library)
    except RuntimeError:
        pass  # already defined (a real CPU torchvision, or defined twice)


class _BeforeTorchvision(importlib.abc.MetaPathFinder):
    """Runs _define_schemas once, just before the first import of torchvision."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "torchvision":
            sys.meta_path.remove(self)
            _define_schemas()
        return None


_libraries: list = []
sys.meta_path.insert(0, _BeforeTorchvision())
