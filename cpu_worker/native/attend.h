// The block loop of the kernel: one query token of one sequence over blocks of its KV heads' lists. Picks the
// compute path (AMX, AVX512_BF16, bf16 widened in registers or generic fp32), walks the blocks with prefetch
// and writes o / l and lse = m + log(l) (natural log, fp32).
//
// attend_segments: any runs of blocks (Segment: one KV head's list, blocks [lo, hi), its G query rows and
// its output rows), walked as one stream so that the prefetch crosses from one run into the next: what the
// worker pool's items are (work_items.h). attend: heads [head_begin, head_end) of one sequence, split
// `split_index` of `num_splits` of each head's list, head h written at out_o[(h - out_origin) * G * D] and
// out_lse[(h - out_origin) * G]: the standalone kernel's call.

#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "amx_bf16.h"
#include "avx512_bf16.h"
#include "generic_fp32.h"
#include "isa.h"
#include "online_softmax.h"
#include "prefetch.h"
#include "scratch.h"
#include "split_bf16.h"

namespace {

enum class Path { kGeneric, kSplit, kBf16Dot, kAmx };

template <typename T>
Path choose_path(const Dims& d) {
  if constexpr (std::is_same<T, bf16>::value) {
    const int64_t G = d.group_size, S = d.block_size, D = d.head_dim;
    if (kHasBf16Dot && D % 32 == 0 && D <= 256 && S % 2 == 0) {
#if defined(SCOUT_HAVE_AMX)
      const bool g_divides_16 = G <= 16 && 16 % G == 0;
      if (g_divides_16 && S % 16 == 0 && (S * G) % 32 == 0 && amx_permitted()) return Path::kAmx;
#endif
      return Path::kBf16Dot;
    }
    if (split_supported(d)) return Path::kSplit;
  }
  return Path::kGeneric;
}

// Name of a path, for the benchmark and the start-up log.
inline const char* path_name(Path path) {
  switch (path) {
    case Path::kAmx: return "amx";
    case Path::kBf16Dot: return "bf16dot";
    case Path::kSplit: return "bf16split";
    default: return "fp32";
  }
}

// Number of Prefetch::step() calls per block, mirroring the loops of each path.
inline int64_t prefetch_steps(Path path, const Dims& d) {
  const int64_t G = d.group_size, S = d.block_size, D = d.head_dim;
  if (path == Path::kSplit) return split_prefetch_steps(d);
  if (path == Path::kAmx && S % 32 == 0) return S / 16 * kAmxQkSteps + S / 32 * (D / 32);  // qk_amx + pv_amx
  // q k^T steps, then the p v tiles of each chunk of at most 8 rows.
  int64_t steps = path == Path::kAmx ? S / 16 * kAmxQkSteps : (path == Path::kBf16Dot ? G * (S / 16) : 0);
  for (int64_t g = 0; g < G; g += 8) {
    const int64_t rows = std::min<int64_t>(8, G - g);
    if (path == Path::kGeneric) {  // pv_f32_rows: one step per token per tile
      const int64_t width = (rows <= 4 ? 4 : 2) * kLanes, wide = D / width;
      steps += (wide + (D - wide * width) / kLanes) * S;
    } else {  // PvPairs: one step per token pair per tile
      const int64_t width = (rows <= 2 ? 4 : (rows <= 4 ? 2 : 1)) * 32, wide = D / width;
      steps += (wide + (D - wide * width) / 32) * (S / 2);
    }
  }
  return std::max<int64_t>(steps, 1);
}

// The (K, V) block pointers, in order, of split `split_index` of `num_splits`
// of each head's list in [head_begin, head_end), and first[h - head_begin] =
// index of head h's first block (first[end] = the total).
template <typename T>
void list_blocks(const T* k_cache, const T* v_cache, const int32_t* table, const int32_t* counts,
                 int64_t num_kv_heads, int64_t capacity, const Dims& d, int64_t head_begin, int64_t head_end,
                 int64_t split_index, int64_t num_splits, std::vector<const void*>& blocks,
                 std::vector<int64_t>& first) {
  const int64_t head_stride = d.block_size * d.head_dim, page_stride = num_kv_heads * head_stride;
  blocks.clear();
  first.assign(head_end - head_begin + 1, 0);
  for (int64_t h = head_begin; h < head_end; ++h) {
    first[h - head_begin] = static_cast<int64_t>(blocks.size() / 2);
    const int64_t n = counts[h];
    const int64_t lo = n * split_index / num_splits, hi = n * (split_index + 1) / num_splits;
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t page = table[h * capacity + i];
      blocks.push_back(k_cache + page * page_stride + h * head_stride);
      blocks.push_back(v_cache + page * page_stride + h * head_stride);
    }
  }
  first[head_end - head_begin] = static_cast<int64_t>(blocks.size() / 2);
}

// One run of blocks of one KV head's list: blocks [lo, hi) of `pages`, attended by that head's G query rows
// q [G, D]; o [G, D] and lse [G] (natural log) written to out_o / out_lse.
template <typename T, typename O>
struct Segment {
  const T* q;
  const int32_t* pages;
  int64_t head, lo, hi;
  O* out_o;
  float* out_lse;
};

// The (K, V) block pointers of the segments, in order, and first[s] = index of segment s's first block
// (first[n] = the total).
template <typename T, typename O>
void segment_blocks(const T* k_cache, const T* v_cache, const Segment<T, O>* segments, int64_t n,
                    int64_t num_kv_heads, const Dims& d, std::vector<const void*>& blocks,
                    std::vector<int64_t>& first) {
  const int64_t head_stride = d.block_size * d.head_dim, page_stride = num_kv_heads * head_stride;
  blocks.clear();
  first.assign(n + 1, 0);
  for (int64_t s = 0; s < n; ++s) {
    const Segment<T, O>& seg = segments[s];
    first[s] = static_cast<int64_t>(blocks.size() / 2);
    for (int64_t i = seg.lo; i < seg.hi; ++i) {
      const int64_t page = seg.pages[i];
      blocks.push_back(k_cache + page * page_stride + seg.head * head_stride);
      blocks.push_back(v_cache + page * page_stride + seg.head * head_stride);
    }
  }
  first[n] = static_cast<int64_t>(blocks.size() / 2);
}

template <typename T, typename O>
void attend_segments(const T* k_cache, const T* v_cache, int64_t num_kv_heads, const Dims& d, float scale,
                     const Segment<T, O>* segments, int64_t n) {
  static thread_local Scratch scratch;
  scratch.reserve(d);
  const int64_t G = d.group_size, S = d.block_size, D = d.head_dim;
  const Path path = choose_path<T>(d);

  // All (K, V) block pointers of this call, in order, so the loop can
  // prefetch the next one even across a segment boundary.
  auto& blocks = scratch.blocks;
  auto& first = scratch.head_first;
  segment_blocks(k_cache, v_cache, segments, n, num_kv_heads, d, blocks, first);
  const int64_t total = static_cast<int64_t>(blocks.size() / 2);
  const int64_t block_bytes = S * D * static_cast<int64_t>(sizeof(T));
  const int64_t steps = prefetch_steps(path, d);
  const int64_t far_ways = path == Path::kSplit ? kSplitFarWays : kFarWays;
  Prefetch::warm_up(blocks.data(), total, block_bytes, far_ways);

#if defined(SCOUT_HAVE_AMX)
  if (path == Path::kAmx) amx_configure(G);
#endif

  float* m = scratch.m.data();
  float* l = scratch.l.data();
  float* o = scratch.o.data();
  float* alpha = scratch.alpha.data();
  float* logits = scratch.logits.data();
  for (int64_t s = 0; s < n; ++s) {
    const T* qh = segments[s].q;
    std::fill(m, m + G, kNegInf);
    std::fill(l, l + G, 0.0f);
    std::fill(o, o + G * D, 0.0f);
    if (path == Path::kGeneric) {
      for (int64_t i = 0; i < G * D; ++i) scratch.q_f32[i] = static_cast<float>(qh[i]);
    }
#if defined(SCOUT_HAVE_SPLIT)
    if (path == Path::kSplit) split_rows(qh, scratch.q_f32.data(), d);
#endif
#if defined(SCOUT_HAVE_AMX)
    if constexpr (std::is_same<T, bf16>::value) {
      if (path == Path::kAmx) {
        pack_q_pairs(qh, scratch.q_pairs.data(), d);
        switch (D / 32) {
          case 1: amx_load_q<1>(scratch.q_pairs.data(), G); break;
          case 2: amx_load_q<2>(scratch.q_pairs.data(), G); break;
          case 3: amx_load_q<3>(scratch.q_pairs.data(), G); break;
          case 4: amx_load_q<4>(scratch.q_pairs.data(), G); break;
          default: break;
        }
      }
    }
#endif
    for (int64_t b = first[s]; b < first[s + 1]; ++b) {
      const T* kb = static_cast<const T*>(blocks[2 * b]);
      const T* vb = static_cast<const T*>(blocks[2 * b + 1]);
      const Prefetch pf(blocks.data(), b, total, block_bytes, steps, far_ways);
#if defined(SCOUT_HAVE_SPLIT)
      if constexpr (std::is_same<T, bf16>::value) {
        if (path == Path::kSplit) {
          for_split_rows<QkSplit>(G, kb, scratch.q_f32.data(), d, scale, logits, pf);
          softmax_rows(logits, m, l, alpha, d);
          for_split_rows<PvSplit>(G, vb, logits, alpha, o, d, pf);
          pf.finish();
          continue;
        }
      }
#endif
      if constexpr (std::is_same<T, bf16>::value && kHasBf16Dot) {
#if defined(__AVX512BF16__)
        uint32_t* pairs = scratch.p_pairs.data();
        if (path == Path::kAmx) {
#if defined(SCOUT_HAVE_AMX)
          switch (D / 32) {
            case 1: qk_amx<1>(kb, scratch.q_pairs.data(), d, logits, pf); break;
            case 2: qk_amx<2>(kb, scratch.q_pairs.data(), d, logits, pf); break;
            case 3: qk_amx<3>(kb, scratch.q_pairs.data(), d, logits, pf); break;
            case 4: qk_amx<4>(kb, scratch.q_pairs.data(), d, logits, pf); break;
            default: qk_amx<0>(kb, scratch.q_pairs.data(), d, logits, pf); break;
          }
          softmax_tokens(logits, scale, m, l, alpha, pairs, d);
          if (S % 32 == 0) {
            pv_amx(vb, pairs, scratch.p_pairs_g.data(), scratch.v_tiles.data(), alpha, o, d, pf);
          } else {
            for_row_chunks<PvPairs>(G, vb, pairs, G, int64_t{1}, alpha, o, d, pf);
          }
          pf.finish();
#endif
          continue;
        }
        if (path == Path::kBf16Dot) {
          switch (D / 32) {  // choose_path: D % 32 == 0 and D <= 256
            case 1: qk_bf16_dot<1>(kb, qh, d, scale, logits, pf); break;
            case 2: qk_bf16_dot<2>(kb, qh, d, scale, logits, pf); break;
            case 3: qk_bf16_dot<3>(kb, qh, d, scale, logits, pf); break;
            case 4: qk_bf16_dot<4>(kb, qh, d, scale, logits, pf); break;
            case 5: qk_bf16_dot<5>(kb, qh, d, scale, logits, pf); break;
            case 6: qk_bf16_dot<6>(kb, qh, d, scale, logits, pf); break;
            case 7: qk_bf16_dot<7>(kb, qh, d, scale, logits, pf); break;
            default: qk_bf16_dot<8>(kb, qh, d, scale, logits, pf); break;
          }
          softmax_rows(logits, m, l, alpha, d);
          pack_pairs_rows(logits, pairs, d);
          for_row_chunks<PvPairs>(G, vb, pairs, int64_t{1}, S / 2, alpha, o, d, pf);
          pf.finish();
          continue;
        }
#endif
      }
      // Generic path.
      const float* kf;
      if constexpr (std::is_same<T, float>::value) {
        kf = kb;
      } else {
        float* buf = scratch.k_f32.data();
        const int64_t n = S * D, nv = n - n % kLanes;
        for (int64_t i = 0; i < nv; i += kLanes) vstore(buf + i, vload(kb + i));
        for (int64_t i = nv; i < n; ++i) buf[i] = static_cast<float>(kb[i]);
        kf = buf;
      }
      qk_f32(kf, scratch.q_f32.data(), d, scale, logits);
      softmax_rows(logits, m, l, alpha, d);
      for_row_chunks<PvF32>(G, vb, logits, alpha, o, d, pf);
      pf.finish();
    }
    // o / l and lse = m + log(l); an empty list gives o = 0, lse = -inf.
#if defined(__AVX512BF16__)
    if (path == Path::kBf16Dot || path == Path::kAmx) {
      for (int64_t g = 0; g < G; ++g) unpermute_pairs(o + g * D, D);
    }
#endif
#if defined(SCOUT_HAVE_SPLIT)
    if (path == Path::kSplit) {
      for (int64_t g = 0; g < G; ++g) unsplit_row(o + g * D, D);
    }
#endif
    O* oh = segments[s].out_o;
    for (int64_t g = 0; g < G; ++g) {
      const bool empty = l[g] == 0.0f;
      const float inv = empty ? 0.0f : 1.0f / l[g];
      for (int64_t i = 0; i < D; ++i) oh[g * D + i] = static_cast<O>(o[g * D + i] * inv);
      segments[s].out_lse[g] = empty ? kNegInf : m[g] + std::log(l[g]);
    }
  }
#if defined(SCOUT_HAVE_AMX)
  if (path == Path::kAmx) _tile_release();
#endif
}


template <typename T, typename O>
void attend(const T* q, const T* k_cache, const T* v_cache, const int32_t* table, const int32_t* counts,
            int64_t num_kv_heads, int64_t capacity, const Dims& d, float scale, int64_t head_begin,
            int64_t head_end, int64_t split_index, int64_t num_splits, O* out_o, float* out_lse,
            int64_t out_origin = 0) {
  static thread_local std::vector<Segment<T, O>> segments;
  segments.clear();
  const int64_t G = d.group_size, D = d.head_dim;
  for (int64_t h = head_begin; h < head_end; ++h) {
    const int64_t n = counts[h];
    segments.push_back(Segment<T, O>{q + h * G * D, table + h * capacity, h, n * split_index / num_splits,
                                     n * (split_index + 1) / num_splits, out_o + (h - out_origin) * G * D,
                                     out_lse + (h - out_origin) * G});
  }
  attend_segments<T, O>(k_cache, v_cache, num_kv_heads, d, scale, segments.data(),
                        static_cast<int64_t>(segments.size()));
}

}  // namespace
