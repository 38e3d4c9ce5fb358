"""Compile a @triton.jit kernel of the project for a Hopper GPU (sm_90) with Triton's real backend, here, without
a GPU: nothing is launched. Used by the compile checks (tests/test_kernels_compile_sm90.py) and the row-width sweep
(benchmarks/kernel_widths.py). Run it in a process without TRITON_INTERPRET: under it @triton.jit builds no
compiler input."""

from __future__ import annotations

INDEX_POINTERS = ("page_ids_ptr", "rows_ptr", "pages_ptr", "offsets_ptr", "digest_rows_ptr", "host_rows_ptr",
                  "table_ptr", "num_full_ptr", "selected_ptr", "counts_ptr", "resident_ptr", "slots_ptr",
                  "status_ptr", "block_table_ptr", "last_block_len_ptr", "gate_ptr", "forced_ptr",
                  "window_pages_ptr", "resident_pages_ptr", "host_table_ptr", "dev_pages_ptr", "dev_counts_ptr",
                  "cpu_blocks_ptr", "cpu_pages_ptr", "cpu_counts_ptr", "cap_ptr", "zc_pages_ptr", "zc_counts_ptr",
                  "listed_ptr", "counters_ptr", "previous_ptr", "num_tokens_ptr", "page_counts_ptr", "row_topk_ptr",
                  "quota_ptr", "leaving_block_ptr", "leaving_page_ptr", "due_ptr", "runs_ptr", "brake_ptr",
                  "positions_ptr")
FP32_POINTERS = ("part_ptr", "lse_ptr", "cpu_o_ptr", "cpu_lse_ptr", "fb_o_ptr", "fb_lse_ptr", "out_lse_ptr",
                 "zc_o_ptr", "zc_lse_ptr", "part_o_ptr", "part_lse_ptr", "scores_ptr")
INT8_POINTERS = ("ready_ptr",)  # the resident rows' fill flags
FP32_SCALARS = ("scale", "scale_log2", "log_block_size", "recall_beta")


def compile_for_hopper(kernel, constexprs: dict) -> str:
    """The PTX of a @triton.jit kernel compiled for sm_90: bf16 tensors, int32 index tensors, int64 strides."""
    return compiled_for_hopper(kernel, constexprs).asm["ptx"]


def compiled_for_hopper(kernel, constexprs: dict, num_warps: int | None = None):
    """The compiled kernel (its PTX in .asm["ptx"], the shared memory it needs in .metadata.shared), at
    `num_warps`, by default the warps the engine launches it with at these constexprs (sizes.warps_for)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from scout_sglang.kernels.triton.sizes import warps_for

    def arg_type(name):
        if name in constexprs:
            return "constexpr"
        if name == "clock_ns_ptr":
            return "*i64"
        if name.endswith("_ptr"):
            return "*i32" if name in INDEX_POINTERS else "*fp32" if name in FP32_POINTERS else \
                "*i8" if name in INT8_POINTERS else "*bf16"
        return "fp32" if name in FP32_SCALARS else "i64"

    signature = {name: arg_type(name) for name in kernel.arg_names}
    return triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs),
                          target=GPUTarget("cuda", 90, 32), options=dict(num_warps=num_warps or warps_for(constexprs)))
