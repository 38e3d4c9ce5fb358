"""Recorded Triton launches of a layer's stages, replayed without the host code that made them.

digest -> select -> split -> device part / CPU part -> merge -> recall: on the
Triton path every stage of a layer is one or two kernel launches whose
arguments are the engine's static buffers, the step plan's views (the same
addresses at the same step size) and a few tensors the layer is called with
(its query, new K/V, output). So the host work of building those launches (the
stage wrappers' checks, configuration and argument lists) is the same every
step, and is done once: the first call of a segment with a given signature
records its launches instead of running them, then every call (that one
included) replays the list, putting the call's own tensors where the recorded
ones were. It is the eager twin of a captured CUDA graph: what stays is the
launches themselves (Triton's launcher), not the Python around them.

Recording is safe or refused: a segment must make no tensor op but views
besides its launches, and no launch may take a view of a call's own tensor
(only the tensor itself can be put back). A signature holds what the recorded
arguments depend on: the step's row count and table widths (the plan's
layout), and the shape, strides and dtype of each of the call's tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from scout_sglang.core.op_counter import OpCounter, unwrap_triton_launches, wrap_triton_launches


class NotReplayable(RuntimeError):
    """A segment's host code does more than launch Triton kernels over static and given tensors."""


@dataclass
class Launch:
    kernel: object  # a triton JITFunction (or InterpretedFunction)
    grid: tuple
    args: list
    kwargs: dict
    given: list  # (position in args, name of the call's tensor it takes)

    def __call__(self, tensors: dict) -> None:
        args = self.args
        for position, name in self.given:
            args[position] = tensors[name]
        self.kernel.run(*args, grid=self.grid, warmup=False, **self.kwargs)


class Recorder:
    """While active, Triton launches are recorded (kernel, grid, args, kwargs in `launches`), not run: what a CUDA
    graph capture does with kernel launches."""

    def __init__(self):
        self.launches: list[tuple] = []
        self._inside = 0
        self._patched = []

    def __enter__(self):
        self._patched = wrap_triton_launches(self, run=False, on_launch=self._record)
        return self

    def __exit__(self, *exc):
        unwrap_triton_launches(self._patched)
        return False

    def _record(self, kernel, args, kwargs) -> None:
        kwargs = dict(kwargs)
        grid = kwargs.pop("grid")
        kwargs.pop("warmup", None)
        self.launches.append((kernel, grid, list(args), kwargs))


def _storage(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


def record(segment, tensors: dict[str, torch.Tensor], name: str) -> list[Launch]:
    """Run `segment(**tensors)` recording its launches -> the Launch list (NotReplayable when it cannot be)."""
    ops = OpCounter()
    with Recorder() as recorder, ops:
        segment(**tensors)
    if ops.launches():
        raise NotReplayable(f"{name}: tensor ops besides the Triton launches ({dict(ops.ops)})")
    given_storage = {_storage(t): key for key, t in tensors.items()}
    launches = []
    for kernel, grid, args, kwargs in recorder.launches:
        given = []
        for position, arg in enumerate(args):
            if not isinstance(arg, torch.Tensor):
                continue
            match = next((key for key, t in tensors.items() if arg is t), None)
            if match is not None:
                given.append((position, match))
            elif _storage(arg) in given_storage:
                raise NotReplayable(f"{name}: a launch of {getattr(kernel, '__name__', kernel)} takes a view of "
                                    f"{given_storage[_storage(arg)]!r}, not the tensor itself")
        if callable(grid):
            raise NotReplayable(f"{name}: a launch with a grid function")
        launches.append(Launch(kernel, grid, args, kwargs, given))
    return launches


def signature(tensors: dict[str, torch.Tensor]) -> tuple:
    return tuple((key, tuple(t.shape), t.stride(), t.dtype) for key, t in tensors.items())


class LaunchPrograms:
    """The recorded segments of an engine's layers, by (segment, layer, step signature, tensors' signature)."""

    def __init__(self):
        self._programs: dict[tuple, list[Launch]] = {}

    def run(self, name: str, step_key: tuple, segment, **tensors) -> None:
        """Replay the launches of segment(**tensors) (recorded at the first call with this name and signature)
        with these tensors. step_key: what else the recorded arguments depend on (layer, rows, table widths)."""
        key = (name, step_key, signature(tensors))
        program = self._programs.get(key)
        if program is None:
            program = self._programs[key] = record(segment, tensors, name)
        for launch in program:
            launch(tensors)

    def __len__(self) -> int:
        return len(self._programs)
