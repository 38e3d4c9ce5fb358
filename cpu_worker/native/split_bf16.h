// bf16 compute path for vector ISAs without bf16 dot products (AVX2, AVX-512F
// without AVX512_BF16): fp32 FMA on K/V rows widened in registers, logits in
// [G][S]. Empty for the scalar build (kLanes == 1).
//
// Why this shape (measured on an AMD EPYC Zen 3, AVX2, where the generic path
// ran at ~5 GB/s even with the blocks in L2, i.e. compute-bound):
//  - widening: one 2*kLanes bf16 load gives two fp32 vectors, the even
//    elements by a 16-bit left shift and the odd ones by masking the low half
//    (2 cheap ops per 2 vectors, no staging copy of K in fp32). Lane i then
//    holds dim 2i (even) or 2i+1 (odd); q is split the same way (split_rows),
//    and o accumulates in split order until unsplit_rows.
//  - q k^T: TT tokens x GB query rows per step, TT*GB <= 8 accumulators, so
//    two FMA pipes with 4-cycle latency stay busy and each q vector is loaded
//    once per TT tokens; the per-token lane sums are reduced kLanes tokens at
//    a time by the transpose tree (reduce_lanes), not one horizontal sum each.
//  - p v: GB rows x CH chunks, 2*CH*GB <= 8 accumulators held over the whole
//    block (16 ymm registers: accumulators, two widened V vectors per chunk,
//    the broadcast p and the mask).

#pragma once

#include <algorithm>

#include "isa.h"
#include "prefetch.h"
#include "scratch.h"

namespace {

constexpr int kSplitChunk = 2 * kLanes;  // dims per widened load
constexpr int kSplitMaxRows = 4;         // query rows per register tile

#if defined(SCOUT_HAVE_SPLIT)
constexpr bool kHasSplit = true;
#else
constexpr bool kHasSplit = false;
#endif

inline bool split_supported(const Dims& d) { return kHasSplit && d.head_dim % kSplitChunk == 0; }

// Tokens per q k^T step for GB query rows: TT*GB <= 8 accumulators.
constexpr int split_tokens(int GB) { return GB == 1 ? 8 : (GB == 2 ? 4 : 2); }
// 2*kLanes-dim chunks per p v tile for GB rows: 2*CH*GB <= 8 accumulators.
constexpr int split_chunks(int GB) { return GB == 1 ? 4 : (GB == 2 ? 2 : 1); }

// Prefetch::step() calls per block, mirroring the loops below.
inline int64_t split_prefetch_steps(const Dims& d) {
  const int64_t G = d.group_size, S = d.block_size, D = d.head_dim;
  int64_t steps = 0;
  for (int64_t g = 0; g < G; g += kSplitMaxRows) {
    const int GB = static_cast<int>(std::min<int64_t>(kSplitMaxRows, G - g));
    const int64_t TT = split_tokens(GB), chunks = D / kSplitChunk, CH = split_chunks(GB);
    steps += S / kLanes * (kLanes / TT) + S % kLanes;             // q k^T
    steps += (chunks / CH + chunks % CH) * ((S + 3) / 4);         // p v: one step per 4 tokens of a tile
  }
  return std::max<int64_t>(steps, 1);
}

#if defined(SCOUT_HAVE_SPLIT)

// q [G][D] (any dtype) -> fp32 in split order: per 2*kLanes chunk, the even
// dims then the odd dims.
template <typename T>
inline void split_rows(const T* q, float* out, const Dims& d) {
  const int64_t G = d.group_size, D = d.head_dim;
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t c = 0; c < D; c += kSplitChunk) {
      for (int i = 0; i < kLanes; ++i) {
        out[g * D + c + i] = static_cast<float>(q[g * D + c + 2 * i]);
        out[g * D + c + kLanes + i] = static_cast<float>(q[g * D + c + 2 * i + 1]);
      }
    }
  }
}

// Inverse of split_rows for one fp32 row of D, in place.
inline void unsplit_row(float* row, int64_t D) {
  float tmp[kSplitChunk];
  for (int64_t c = 0; c < D; c += kSplitChunk) {
    for (int i = 0; i < kLanes; ++i) {
      tmp[2 * i] = row[c + i];
      tmp[2 * i + 1] = row[c + kLanes + i];
    }
    std::copy(tmp, tmp + kSplitChunk, row + c);
  }
}

// logits[g*S + s] = scale * dot(q[g], k[s]) for GB rows; q in split order.
template <int GB>
inline void qk_split(const bf16* k, const float* q, const Dims& d, float scale, float* logits, const Prefetch& pf) {
  constexpr int TT = split_tokens(GB);
  const int64_t S = d.block_size, D = d.head_dim;
  const vfloat vscale = vset1(scale);
  alignas(64) float part[GB][kLanes][kLanes];  // per-token lane sums, reduced kLanes tokens at a time
  int64_t s0 = 0;
  for (; s0 + kLanes <= S; s0 += kLanes) {
    for (int t0 = 0; t0 < kLanes; t0 += TT) {
      pf.step();
      vfloat acc[TT][GB];
      for (int t = 0; t < TT; ++t) {
        for (int g = 0; g < GB; ++g) acc[t][g] = vzero();
      }
      const bf16* ks = k + (s0 + t0) * D;
      for (int64_t c = 0; c < D; c += kSplitChunk) {
        vfloat ke[TT], ko[TT];
        for (int t = 0; t < TT; ++t) vload_split(ks + t * D + c, ke[t], ko[t]);
        for (int g = 0; g < GB; ++g) {
          const vfloat qe = vload(q + g * D + c), qo = vload(q + g * D + c + kLanes);
          for (int t = 0; t < TT; ++t) acc[t][g] = vfma(ko[t], qo, vfma(ke[t], qe, acc[t][g]));
        }
      }
      for (int t = 0; t < TT; ++t) {
        for (int g = 0; g < GB; ++g) vstore(part[g][t0 + t], acc[t][g]);
      }
    }
    for (int g = 0; g < GB; ++g) {
      vfloat rows[kLanes];
      for (int t = 0; t < kLanes; ++t) rows[t] = vload(part[g][t]);
      vstore(logits + g * S + s0, vmul(reduce_lanes(rows), vscale));
    }
  }
  for (; s0 < S; ++s0) {  // tokens past the last full kLanes group
    pf.step();
    const bf16* ks = k + s0 * D;
    for (int g = 0; g < GB; ++g) {
      vfloat a = vzero();
      for (int64_t c = 0; c < D; c += kSplitChunk) {
        vfloat ke, ko;
        vload_split(ks + c, ke, ko);
        a = vfma(ko, vload(q + g * D + c + kLanes), vfma(ke, vload(q + g * D + c), a));
      }
      logits[g * S + s0] = vsum(a) * scale;
    }
  }
}

// o[g] = o[g] * alpha[g] + sum_s p[g][s] v[s] for GB rows over CH chunks from
// dim d0; o in split order. 2*CH*GB accumulators stay in registers.
template <int GB, int CH>
inline void pv_split_tile(const bf16* v, const float* p, const float* alpha, float* o, int64_t d0, const Dims& d,
                          const Prefetch& pf) {
  const int64_t S = d.block_size, D = d.head_dim;
  vfloat acc[GB][2 * CH];
  for (int g = 0; g < GB; ++g) {
    const vfloat a = vset1(alpha[g]);
    for (int j = 0; j < 2 * CH; ++j) acc[g][j] = vmul(vload(o + g * D + d0 + j * kLanes), a);
  }
  for (int64_t s = 0; s < S; ++s) {
    if (s % 4 == 0) pf.step();
    vfloat ve[CH], vo[CH];
    for (int c = 0; c < CH; ++c) vload_split(v + s * D + d0 + c * kSplitChunk, ve[c], vo[c]);
    for (int g = 0; g < GB; ++g) {
      const vfloat pg = vset1(p[g * S + s]);
      for (int c = 0; c < CH; ++c) {
        acc[g][2 * c] = vfma(pg, ve[c], acc[g][2 * c]);
        acc[g][2 * c + 1] = vfma(pg, vo[c], acc[g][2 * c + 1]);
      }
    }
  }
  for (int g = 0; g < GB; ++g) {
    for (int j = 0; j < 2 * CH; ++j) vstore(o + g * D + d0 + j * kLanes, acc[g][j]);
  }
}

template <int GB>
inline void pv_split(const bf16* v, const float* p, const float* alpha, float* o, const Dims& d, const Prefetch& pf) {
  constexpr int CH = split_chunks(GB);
  const int64_t D = d.head_dim;
  int64_t d0 = 0;
  for (; d0 + CH * kSplitChunk <= D; d0 += CH * kSplitChunk) pv_split_tile<GB, CH>(v, p, alpha, o, d0, d, pf);
  for (; d0 < D; d0 += kSplitChunk) pv_split_tile<GB, 1>(v, p, alpha, o, d0, d, pf);
}

// Runs F<GB>::run(g, args...) over the G rows in chunks of at most
// kSplitMaxRows, so that each chunk's tiles fit the registers.
template <template <int> class F, typename... Args>
inline void for_split_rows(int64_t G, Args&&... args) {
  for (int64_t g = 0; g < G; g += kSplitMaxRows) {
    switch (std::min<int64_t>(kSplitMaxRows, G - g)) {
      case 4: F<4>::run(g, args...); break;
      case 3: F<3>::run(g, args...); break;
      case 2: F<2>::run(g, args...); break;
      default: F<1>::run(g, args...); break;
    }
  }
}

template <int GB>
struct QkSplit {
  static void run(int64_t g, const bf16* k, const float* q, const Dims& d, float scale, float* logits,
                  const Prefetch& pf) {
    qk_split<GB>(k, q + g * d.head_dim, d, scale, logits + g * d.block_size, pf);
  }
};

template <int GB>
struct PvSplit {
  static void run(int64_t g, const bf16* v, const float* p, const float* alpha, float* o, const Dims& d,
                  const Prefetch& pf) {
    pv_split<GB>(v, p + g * d.block_size, alpha + g, o + g * d.head_dim, d, pf);
  }
};

#endif  // SCOUT_HAVE_SPLIT

}  // namespace
