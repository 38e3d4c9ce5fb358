// Paged sparse decode attention on the CPU: the fast path of the CPU part.
//
// One call attends one query token of one sequence (the G query heads of each
// KV head in [head_begin, head_end)) over that head's listed blocks, reading
// the paged host cache in place through the block list (no staging copy).
// The calling Python thread releases the GIL (see the binding at the end).
// Host wrapper and validation: cpu_worker/native_kernel.py. Layout:
// scout_sglang/layout.py. LSE is natural log, fp32.
//
//   k_cache, v_cache [P, Hkv, S, D]: block (page p, head h) = S*D contiguous
//   block_table [B, Hkv, C] int32, counts [B, Hkv] int32
//   split i of n takes blocks [i*count/n, (i+1)*count/n) of every head
//
// Per block: logits = scale * q k^T, an online-softmax update in fp32, then
// o += p v. The host this was tuned on has little vector throughput per byte of
// DRAM bandwidth, so the work per token is kept small:
//   bf16 + AMX          q k^T on tiles, K rows loaded straight from the page;
//                       p v on tiles (p in bf16, V rows interleaved by pairs)
//   bf16 + AVX512_BF16  q k^T by vdpbf16ps, 16 tokens reduced by a transpose
//                       tree; p v by vdpbf16ps on token pairs (p in bf16)
//   bf16, AVX2 or AVX-512F without BF16: fp32 FMA on rows widened in
//                       registers (split_bf16.h: even/odd dims, no staging)
//   fp16/fp32, scalar:  fp32 FMA on converted rows
// and the blocks ahead are prefetched in a trickle under the compute (class
// Prefetch). Rounding p to bf16 costs ~1e-3 absolute on o for bf16 inputs,
// well inside the bf16 tolerance; fp16/fp32 inputs stay in fp32 throughout.
//
// Files (cpu_worker/native/): this file holds the torch binding only (argument
// unpacking, dtype dispatch, GIL release); the kernels are headers, all of this
// one translation unit and kept in an anonymous namespace as one file would be:
//   isa.h            ISA detection, types; simd_{avx512,avx2,scalar}.h vectors
//   scratch.h        Dims and per-thread scratch;  prefetch.h  class Prefetch
//   online_softmax.h online-softmax state updates (row- and token-major)
//   generic_fp32.h   fp16/fp32 (any ISA) path;  avx512_bf16.h  vdpbf16ps path
//   split_bf16.h     bf16 path of AVX2 / AVX-512F without BF16
//   amx_bf16.h       AMX tile path;  attend.h  path choice and the block loop
//   read_ceiling.h   the same block walk without compute (the benchmark's
//                    memory ceiling of this access pattern)
//   work_items.h     a part's items of equal blocks, and the merge of a cut
//                    list's pieces
//   worker_pool.h    the CPU part's worker pool: C++ threads driven by the
//                    hand-off's control words (no Python, no GIL, no lock per
//                    item)

#include <torch/extension.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "attend.h"
#include "read_ceiling.h"
#include "worker_pool.h"

namespace {

template <typename T>
void dispatch_out(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                  const torch::Tensor& block_table, const torch::Tensor& counts, int64_t batch_index,
                  const torch::Tensor& out_o, const torch::Tensor& out_lse, int64_t out_index, double scale,
                  int64_t head_begin, int64_t head_end, int64_t split_index, int64_t num_splits) {
  const int64_t num_qo_heads = q.size(1), head_dim = q.size(2);
  const int64_t num_kv_heads = k_cache.size(1), capacity = block_table.size(2);
  const Dims d{num_qo_heads / num_kv_heads, k_cache.size(2), head_dim};
  const T* qb = q.data_ptr<T>() + batch_index * num_qo_heads * head_dim;
  const int32_t* table = block_table.data_ptr<int32_t>() + batch_index * num_kv_heads * capacity;
  const int32_t* cnt = counts.data_ptr<int32_t>() + batch_index * num_kv_heads;
  float* lse = out_lse.data_ptr<float>() + out_index * num_qo_heads;
  const int64_t o_offset = out_index * num_qo_heads * head_dim;
  const float s = static_cast<float>(scale);
  if (out_o.scalar_type() == torch::kFloat32) {
    attend<T, float>(qb, k_cache.data_ptr<T>(), v_cache.data_ptr<T>(), table, cnt, num_kv_heads, capacity, d, s,
                     head_begin, head_end, split_index, num_splits, out_o.data_ptr<float>() + o_offset, lse);
  } else {
    attend<T, T>(qb, k_cache.data_ptr<T>(), v_cache.data_ptr<T>(), table, cnt, num_kv_heads, capacity, d, s,
                 head_begin, head_end, split_index, num_splits, out_o.data_ptr<T>() + o_offset, lse);
  }
}

}  // namespace

// Entry point; the host wrapper has validated every argument (kernels never
// validate). Runs with the GIL released.
void decode(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
            const torch::Tensor& block_table, const torch::Tensor& counts, int64_t batch_index,
            const torch::Tensor& out_o, const torch::Tensor& out_lse, int64_t out_index, double scale,
            int64_t head_begin, int64_t head_end, int64_t split_index, int64_t num_splits) {
  switch (q.scalar_type()) {
    case torch::kBFloat16:
      dispatch_out<bf16>(q, k_cache, v_cache, block_table, counts, batch_index, out_o, out_lse, out_index, scale,
                         head_begin, head_end, split_index, num_splits);
      break;
    case torch::kFloat16:
      dispatch_out<fp16>(q, k_cache, v_cache, block_table, counts, batch_index, out_o, out_lse, out_index, scale,
                         head_begin, head_end, split_index, num_splits);
      break;
    default:
      dispatch_out<float>(q, k_cache, v_cache, block_table, counts, batch_index, out_o, out_lse, out_index, scale,
                          head_begin, head_end, split_index, num_splits);
      break;
  }
}

// dst[dst_rows[i]] = src[src_rows[i]] for the entries whose dst row is not `skip_row`: the copies of a
// fixed-length list whose unused entries point at a scratch row (recall, window admission). The CPU twin of
// the device kernel that skips those entries, so the work follows the copies made, not the list's length.
// Rows are contiguous runs of row_bytes; the wrapper (kernels/block_copy.py) checks shapes and dtypes.
int64_t copy_rows(const torch::Tensor& src, const torch::Tensor& src_rows, const torch::Tensor& dst,
                  const torch::Tensor& dst_rows, int64_t skip_row) {
  const int64_t row_bytes = src.stride(0) * src.element_size();
  const char* from = static_cast<const char*>(src.data_ptr());
  char* to = static_cast<char*>(dst.data_ptr());
  const int64_t* src_index = src_rows.data_ptr<int64_t>();
  const int64_t* dst_index = dst_rows.data_ptr<int64_t>();
  int64_t copied = 0;
  for (int64_t i = 0; i < src_rows.numel(); ++i) {
    if (dst_index[i] == skip_row) continue;
    std::memcpy(to + dst_index[i] * row_bytes, from + src_index[i] * row_bytes, row_bytes);
    ++copied;
  }
  return copied;
}

// Reads (and XORs) the K/V blocks a decode() call of the same arguments would
// read, with the same prefetch and no compute: the access pattern's memory
// ceiling, for the benchmark only (read_ceiling.h): bf16, fp16 or fp32, in the
// layout decode() takes; nothing is validated, the benchmark builds the inputs.
int64_t read_blocks_of(const torch::Tensor& k_cache, const torch::Tensor& v_cache, const torch::Tensor& block_table,
                       const torch::Tensor& counts, int64_t batch_index, int64_t group_size, int64_t head_begin,
                       int64_t head_end) {
  const int64_t num_kv_heads = k_cache.size(1), capacity = block_table.size(2);
  const Dims d{group_size, k_cache.size(2), k_cache.size(3)};
  const int32_t* table = block_table.data_ptr<int32_t>() + batch_index * num_kv_heads * capacity;
  const int32_t* cnt = counts.data_ptr<int32_t>() + batch_index * num_kv_heads;
  uint64_t x = 0;
  switch (k_cache.scalar_type()) {
    case torch::kBFloat16:
      x = read_blocks<bf16>(k_cache.data_ptr<bf16>(), v_cache.data_ptr<bf16>(), table, cnt, num_kv_heads, capacity,
                            d, head_begin, head_end);
      break;
    case torch::kFloat16:
      x = read_blocks<fp16>(k_cache.data_ptr<fp16>(), v_cache.data_ptr<fp16>(), table, cnt, num_kv_heads, capacity,
                            d, head_begin, head_end);
      break;
    default:
      x = read_blocks<float>(k_cache.data_ptr<float>(), v_cache.data_ptr<float>(), table, cnt, num_kv_heads,
                             capacity, d, head_begin, head_end);
      break;
  }
  return static_cast<int64_t>(x >> 1);
}

// The blocks of each item a part of these per-list counts [lists] is cut into (work_items.h), for tests;
// empty when a count is outside [0, capacity].
std::vector<int64_t> item_blocks(const torch::Tensor& counts, int64_t capacity, int64_t threads,
                                 int64_t min_item_blocks) {
  ItemPlan plan;
  std::vector<int64_t> out;
  if (plan_items(counts.data_ptr<int32_t>(), counts.numel(), capacity, threads, min_item_blocks, plan) >= 0) {
    return out;
  }
  for (int64_t i = 0; i < plan.items; ++i) out.push_back(plan.item_end(i) - plan.item_begin(i));
  return out;
}

// The vector ISA compiled in, and the bf16 path this process would take.
std::string isa() {
  std::string name = kIsa;
#if defined(__AVX512BF16__)
  name += "+bf16dot";
#endif
#if defined(SCOUT_HAVE_AMX)
  if (amx_permitted()) name += "+amx";
#endif
  return name;
}

// The compute path a bf16 call of this shape takes ("amx", "bf16dot",
// "bf16split" or "fp32"), for the benchmark and the start-up log.
std::string bf16_path(int64_t group_size, int64_t block_size, int64_t head_dim) {
  return path_name(choose_path<bf16>(Dims{group_size, block_size, head_dim}));
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("decode", &decode,
        "Sparse decode attention of one sequence over a range of KV heads (GIL released).",
        pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("copy_rows", &copy_rows, "Row copies of a fixed-length list, skipping its scratch entries (GIL released).",
        pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("read_blocks", &read_blocks_of,
        "Read the K/V blocks of one sequence's heads as decode() would, without compute (GIL released).",
        pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("isa", &isa, "Vector ISA the kernel was compiled for.");
  using gil_release = pybind11::call_guard<pybind11::gil_scoped_release>;
  pybind11::class_<WorkerPool>(m, "WorkerPool")
      .def(pybind11::init<int64_t, std::vector<int64_t>, bool, double, double, int64_t>(), pybind11::arg("threads"),
           pybind11::arg("cpus"), pybind11::arg("pin"), pybind11::arg("grace_s"), pybind11::arg("stall_s"),
           pybind11::arg("min_item_blocks"))
      .def("register_layer", &WorkerPool::register_layer,
           "Register one layer's CPU part: staging, outputs, host store, control words (kept alive here).")
      .def("expect", &WorkerPool::expect, "A step whose layers will ring `seq` without a host call (a GPU's).",
           gil_release())
      .def("kick", &WorkerPool::kick, "A host rang a layer: wake the threads; replace the ones that ended.",
           gil_release())
      .def("wait_done", &WorkerPool::wait_done, "Wait for DONE == seq; the STATUS word, or -1 on timeout.",
           gil_release())
      .def("set_faults", &WorkerPool::set_faults, "Test-only faults drawn once per job.")
      .def("shutdown", &WorkerPool::shutdown, "Stop and join every thread.", gil_release())
      .def("replaced_threads", &WorkerPool::replaced_threads)
      .def("num_threads", &WorkerPool::num_threads)
      .def("busy_ns", &WorkerPool::busy_ns)
      .def("layer_busy_ns", &WorkerPool::layer_busy_ns)
      .def("cpu_ns", &WorkerPool::cpu_ns)
      .def("lock_count", &WorkerPool::lock_count)
      .def("item_path_locks", &WorkerPool::item_path_locks)
      .def("thread_ids", &WorkerPool::thread_ids)
      .def("last_error", &WorkerPool::last_error)
      .def("thread_cpus", &WorkerPool::thread_cpus);
  m.def("item_blocks", &item_blocks, "Blocks of each item of a part's lists (work_items.h), for tests.");
  m.def("bf16_path", &bf16_path, "Compute path of a bf16 call of shape (group_size, block_size, head_dim).");
}
