"""Test session set-up.

Triton kernels run natively when a GPU is present and under the Triton
interpreter otherwise. The interpreter is chosen when a kernel is decorated, so
it must be set before any kernel module is imported: here, at collection time.
The tolerance table and skip markers live in tests/support.py.
"""

import torch

if not torch.cuda.is_available():
    from scout_sglang.triton_interpreter import interpret_without_gpu

    interpret_without_gpu()  # Triton's interpreter, sped up (the same kernels' semantics)


import pytest  # noqa: E402


@pytest.fixture
def one_torch_thread():
    """Tiny tensor ops (the engine-level tests) run ~10x faster on one intra-op thread than on two
    OpenMP threads that spin while another process holds the second core."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(params=["all pairs", "counted"])
def lookup(request, monkeypatch):
    """The Triton stages' list lookups and compaction: all pairs (the lists of a sparse row), or counted through
    histograms (a row as wide as a long request; forced here for any width by a limit of 0)."""
    if request.param == "counted":
        from scout_sglang.kernels.triton import sizes, stage_recall, stage_select, stage_split

        monkeypatch.setattr(sizes, "ALL_PAIRS_LIMIT", 0)
        for module in (stage_recall, stage_select, stage_split):
            module._config.cache_clear()
        request.addfinalizer(lambda: [module._config.cache_clear() for module in (stage_recall, stage_select,
                                                                                    stage_split)])
    return request.param
