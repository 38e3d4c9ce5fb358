// Shape of one call (Dims: G query rows per KV head, S tokens per block, D dims)
// and the per-thread scratch buffers every compute path works in.

#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace {

struct Dims {
  int64_t group_size, block_size, head_dim;
};

// Per-thread scratch, reused across calls.
struct Scratch {
  std::vector<float> logits, o, k_f32, q_f32, m, l, alpha;
  std::vector<uint32_t> p_pairs, q_pairs, p_pairs_g;
  alignas(64) std::array<uint32_t, 512> v_tiles;  // two B tiles of V pairs (AMX p v)
  std::vector<const void*> blocks;  // (k, v) block pointers of one call
  std::vector<int64_t> head_first;  // index in `blocks` of each head's first block
  void reserve(const Dims& d) {
    const size_t g = d.group_size, s = d.block_size, h = d.head_dim;
    logits.resize(g * s + 16);
    o.resize(g * h);
    k_f32.resize(s * h);
    q_f32.resize(g * h);
    m.resize(16 + g);
    l.resize(16 + g);
    alpha.resize(16 + g);
    p_pairs.resize(g * (s / 2) + 16);
    q_pairs.resize(g * (h / 2));
    p_pairs_g.resize(g * (s / 2));
  }
};

}  // namespace
