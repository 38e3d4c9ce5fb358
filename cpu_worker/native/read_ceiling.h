// The memory ceiling of the kernel's access pattern: read_blocks walks the same
// K/V blocks as attend() (same lists, same order, same prefetch trickle) and
// only reads them, so its GB/s is what the memory system gives these random
// blocks on this host with no compute at all. The benchmark sets the kernel
// against it, next to the sequential read bandwidth.

#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "attend.h"

namespace {

// XOR of every 64-byte line of the listed blocks of heads [head_begin,
// head_end) of one sequence (a result the compiler cannot drop).
template <typename T>
uint64_t read_blocks(const T* k_cache, const T* v_cache, const int32_t* table, const int32_t* counts,
                     int64_t num_kv_heads, int64_t capacity, const Dims& d, int64_t head_begin, int64_t head_end) {
  const Path path = choose_path<T>(d);
  std::vector<const void*> blocks;
  std::vector<int64_t> first;
  list_blocks(k_cache, v_cache, table, counts, num_kv_heads, capacity, d, head_begin, head_end, 0, 1, blocks, first);
  const int64_t total = static_cast<int64_t>(blocks.size() / 2);
  const int64_t block_bytes = d.block_size * d.head_dim * static_cast<int64_t>(sizeof(T));
  const int64_t lines = block_bytes / 64, steps = prefetch_steps(path, d);
  const int64_t far_ways = path == Path::kSplit ? kSplitFarWays : kFarWays;
  const int64_t per_step = std::max<int64_t>(1, lines / std::max<int64_t>(steps, 1));
  Prefetch::warm_up(blocks.data(), total, block_bytes, far_ways);
  uint64_t acc[8] = {};
  for (int64_t b = 0; b < total; ++b) {
    const Prefetch pf(blocks.data(), b, total, block_bytes, steps, far_ways);
    const char* k = static_cast<const char*>(blocks[2 * b]);
    const char* v = static_cast<const char*>(blocks[2 * b + 1]);
    for (int64_t line = 0; line < lines; ++line) {
      if (line % per_step == 0) pf.step();
      uint64_t kw[8], vw[8];
      std::memcpy(kw, k + line * 64, 64);
      std::memcpy(vw, v + line * 64, 64);
      for (int j = 0; j < 8; ++j) acc[j] ^= kw[j] ^ vw[j];
    }
    pf.finish();
  }
  uint64_t out = 0;
  for (uint64_t x : acc) out ^= x;
  return out;
}

}  // namespace
