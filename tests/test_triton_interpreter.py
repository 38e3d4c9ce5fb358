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
    """After a launch too: the interpreter leaves a nested call's patches in place (Triton's own library functions
    patch triton.language.core in a scope nobody restores), so which names hold builtins changes."""
    import torch

    from scout_sglang.kernels.stage_select import select_blocks
    from scout_sglang.triton_interpreter import speed_up_interpreter

    if not speed_up_interpreter():
        pytest.skip("this Triton's interpreter has another patching function: it runs as shipped")
    selected, counts = torch.full((2, 2, 6), -1, dtype=torch.int32), torch.zeros(2, 2, dtype=torch.int32)
    select_blocks(torch.randn(2, 2, 20), torch.tensor([20, 15], dtype=torch.int32), topk=6, num_sink_blocks=1,
                  num_local_blocks=2, out_selected=selected, out_counts=counts, impl="triton")
    assert (counts == 6).all()
    fast = interpreter._patch_builtin
    shipped = patched(fast.original)
    assert shipped[0] and shipped[1] == 0
    assert patched(fast) == shipped
    assert patched(fast) == shipped  # its cache changes nothing the second time
    assert speed_up_interpreter() and interpreter._patch_builtin is fast  # applied once
