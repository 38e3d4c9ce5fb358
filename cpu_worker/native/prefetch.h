// Software prefetch of the paged K/V blocks ahead of the compute: block b + 1
// into L1 and a window of further blocks into L2, issued as an even trickle
// from the compute loops (class Prefetch).

#pragma once

#include "isa.h"

namespace {

// Prefetching, two levels. Page ids are random, so the hardware prefetchers
// cannot see the next block coming:
//   near  block b + 1 into L1 while block b is computed (mostly L2 hits then);
//   far   blocks b + 2 .. b + 1 + ways into L2, a 1/ways slice of each per
//         block: every far block is fetched over `ways` block times, and
//         `ways` blocks stream at once, which keeps more DRAM requests in
//         flight than one block at a time (measured ~+15% GB/s on the Xeon).
// The far window is per path (far_ways): on AMD Zen, PREFETCHT1/T2 fill L1
// like T0, so 4 far slices plus the near block evict the block being
// computed from the 32 KiB L1; the split path (AVX2 hosts) measured best with
// one far block (Zen 3: 11 GB/s in L2 vs 7 GB/s with four).
constexpr int64_t kFarWays = 4;
constexpr int64_t kSplitFarWays = 1;
// Prefetch steps per 16-token AMX q k^T step (it takes about as long as four
// token-pair steps of p v).
constexpr int kAmxQkSteps = 4;

// The prefetches issued while block b is computed, a few lines per step() of
// the compute loops: a burst fills the load buffer and stalls the compute,
// an even trickle keeps DRAM busy under it. finish() issues what is left.
class Prefetch {
 public:
  Prefetch(const void* const* blocks, int64_t b, int64_t total, int64_t block_bytes, int64_t steps,
           int64_t far_ways = kFarWays)
      : blocks_(blocks),
        b_(b),
        total_(total),
        far_ways_(std::max<int64_t>(far_ways, 1)),
        lines_((block_bytes + 63) / 64),
        per_step_((lines_ + steps - 1) / std::max<int64_t>(steps, 1)) {}

  inline void step() const { issue(std::min(lines_, next_ + per_step_)); }
  inline void finish() const { issue(lines_); }

  // Before the first block of a call: block 0 to L1, the far window to L2.
  static void warm_up(const void* const* blocks, int64_t total, int64_t block_bytes, int64_t far_ways = kFarWays) {
    for (int64_t b = 0; b < std::min<int64_t>(2 + far_ways, total); ++b) {
      for (int64_t line = 0; line * 64 < block_bytes; ++line) fetch(blocks, b, line, b == 0);
    }
  }

 private:
  static inline void fetch(const void* const* blocks, int64_t block, int64_t line, bool near) {
    const char* k = static_cast<const char*>(blocks[2 * block]) + line * 64;
    const char* v = static_cast<const char*>(blocks[2 * block + 1]) + line * 64;
    if (near) {
      _mm_prefetch(k, _MM_HINT_T0);
      _mm_prefetch(v, _MM_HINT_T0);
    } else {
      _mm_prefetch(k, _MM_HINT_T2);
      _mm_prefetch(v, _MM_HINT_T2);
    }
  }

  // Lines [next_, end) of this block time: the same range of the near block,
  // the matching part of each far block's slice.
  inline void issue(int64_t end) const {
    if (b_ + 1 < total_) {
      for (int64_t line = next_; line < end; ++line) fetch(blocks_, b_ + 1, line, true);
    }
    const int64_t ways = far_ways_, slice = lines_ / ways, lo = next_ / ways, hi = end / ways;
    for (int64_t f = 0; f < ways && b_ + 2 + f < total_; ++f) {
      // Block b + 2 + f takes slice ways - 1 - f now: the first slice at
      // the largest distance, the last one just before it becomes near.
      const int64_t base = (ways - 1 - f) * slice;
      for (int64_t line = base + lo; line < base + hi; ++line) fetch(blocks_, b_ + 2 + f, line, false);
    }
    next_ = end;
  }

  const void* const* blocks_;
  int64_t b_, total_, far_ways_, lines_, per_step_;
  mutable int64_t next_ = 0;
};

}  // namespace
