"""The sped-up Triton interpreter (scout_sglang/triton_interpreter.py) patches what the shipped one patches: the
same members of the same modules at a launch, nothing more in a nested call, everything restored after."""

import pytest

interpreter = pytest.importorskip("triton.runtime.interpreter")


def patched(patch_builtin):
    """(what a launch's patch changes, what a nested call's patch then changes), the launch's restored after."""
    import triton.language as tl

    packages = (tl, tl.tensor, tl.math, tl.core, tl.core.tensor_descriptor_base)
    launch, nested = interpreter._LangPatchScope(), interpreter._LangPatchScope()
    for package in packages:
        patch_builtin(package, interpreter.interpreter_builder, launch)
    for package in packages:
        patch_builtin(package, interpreter.interpreter_builder, nested)
    changes = [(id(owner), name, original) for owner, name, original in launch._changes]
    launch.restore()
    return changes, len(nested._changes)


def test_it_patches_what_the_interpreter_patches():
    from scout_sglang.triton_interpreter import speed_up_interpreter

    if not speed_up_interpreter():
        pytest.skip("this Triton's interpreter has another patching function: it runs as shipped")
    fast = interpreter._patch_builtin
    shipped = patched(fast.original)
    assert shipped[0] and shipped[1] == 0
    assert patched(fast) == shipped
    assert patched(fast) == shipped  # its cache changes nothing the second time
    assert speed_up_interpreter() and interpreter._patch_builtin is fast  # applied once
