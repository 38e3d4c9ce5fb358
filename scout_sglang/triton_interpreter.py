"""A faster Triton interpreter for runs without a GPU (the test session, bench_gpu's dry run): the same patching,
without its repeated search.

The interpreter (TRITON_INTERPRET=1) swaps every builtin of triton.language for its numpy version on each call
of a jit function, nested helpers included, and finds those builtins by walking the modules with
inspect.getmembers each time: about a third of an interpreted kernel's run in this suite. This remembers the
names that hold builtins in each module, walked before any launch (and again when a name comes or goes), and
patches those that hold one now: the members the shipped walk patches, in its order, by the interpreter's own _patch_attr. (The
interpreter leaves a nested call's patches in place after a launch, so which names hold builtins changes from
call to call; which names exist does not.) Applied only where the interpreter has the function this replaces,
with the signature it expects; otherwise it runs as shipped.
"""

from __future__ import annotations

import inspect


def speed_up_interpreter() -> bool:
    """-> whether the patch was applied."""
    try:
        from triton.runtime import interpreter
        import triton.language as tl
    except ImportError:
        return False
    original = getattr(interpreter, "_patch_builtin", None)
    patch_attr = getattr(interpreter, "_patch_attr", None)
    if original is None or patch_attr is None:
        return False
    if hasattr(original, "original"):
        return True  # applied already
    if list(inspect.signature(original).parameters) != ["pkg", "builder", "scope"]:
        return False
    seen: dict[object, tuple[tuple[int, ...], list[str]]] = {}  # module -> (its size, names that held builtins)

    def size_of(pkg) -> tuple[int, ...]:
        return tuple(len(vars(owner)) for owner in (pkg.__mro__ if isinstance(pkg, type) else (pkg,)))

    def walk(pkg, known=None):  # as shipped, adding to the names known
        names = {name for name, member in inspect.getmembers(pkg) if tl.core.is_builtin(member)}
        seen[pkg] = (size_of(pkg), sorted(names | set(known[1] if known else ())))
        return seen[pkg]

    # The modules the interpreter patches, walked now, before any launch: every builtin is in place.
    for pkg in (tl, tl.tensor, tl.math, tl.core, tl.core.tensor_descriptor_base):
        walk(pkg)

    def patch_builtin(pkg, builder, scope):
        known = seen.get(pkg)
        if known is None or known[0] != size_of(pkg):  # new, or a name came or went
            known = walk(pkg, known)
        for name in known[1]:  # in the shipped walk's order
            member = getattr(pkg, name, None)
            if tl.core.is_builtin(member):  # not patched now (the shipped walk patches it too)
                patch_attr(pkg, name, member, builder, scope)

    patch_builtin.original = original
    interpreter._patch_builtin = patch_builtin
    return True


def interpret_without_gpu() -> None:
    """Where no GPU is present: Triton's interpreter (unless TRITON_INTERPRET says otherwise), sped up. Call before
    the first kernel runs."""
    import os

    import torch

    if torch.cuda.is_available():
        return
    os.environ.setdefault("TRITON_INTERPRET", "1")
    if os.environ["TRITON_INTERPRET"] == "1":
        speed_up_interpreter()
