"""A faster Triton interpreter for runs without a GPU (the test session, bench_gpu's dry run): the same patching,
without its repeated search.

The interpreter (TRITON_INTERPRET=1) swaps every builtin of triton.language for its numpy version on each call
of a jit function, nested helpers included, and finds those builtins by walking the modules with
inspect.getmembers each time: about a third of an interpreted kernel's run in this suite. The builtins of a
module do not change within a session, so this walks each module once, then patches the same members the
interpreter would patch (those that are not already patched). The semantics stay the interpreter's own: its
_patch_attr does every swap. Applied only where the interpreter has the function this replaces, with the
signature it expects; otherwise the interpreter runs as shipped.
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
    builtins_of: dict[object, list[tuple[str, object]]] = {}

    def patch_builtin(pkg, builder, scope):
        members = builtins_of.get(pkg)
        if members is None:  # the first call is a launch's, before anything is patched
            members = [(name, member) for name, member in inspect.getmembers(pkg) if tl.core.is_builtin(member)]
            builtins_of[pkg] = members
        if members and getattr(pkg, members[0][0], None) is not members[0][1]:
            return  # a nested call: a module's builtins are patched and restored together, so all of them are
        for name, member in members:
            if getattr(pkg, name, None) is member:  # patched already: the interpreter skips it too
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
