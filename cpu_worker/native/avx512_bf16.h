// bf16 compute path on AVX512_BF16: q k^T and p v by vdpbf16ps, logits in [G][S];
// p v works on token pairs, which permutes dims within each 32-dim chunk of o
// until unpermute_pairs. Empty unless __AVX512BF16__ is defined.

#pragma once

#include "generic_fp32.h"  // for_row_chunks
#include "isa.h"
#include "prefetch.h"
#include "scratch.h"

namespace {

#if defined(__AVX512BF16__)

// logits[g*S + s] = scale * dot(q[g], k[s]); D = 32 * CHUNKS, S % 16 == 0 for
// the vector part. bf16 x bf16 products are exact, accumulated in fp32.
template <int CHUNKS>
inline void qk_bf16_dot(const bf16* k, const bf16* q, const Dims& d, float scale, float* logits, const Prefetch& pf) {
  const int64_t S = d.block_size, D = d.head_dim;
  const vfloat vscale = vset1(scale);
  for (int64_t g = 0; g < d.group_size; ++g) {
    __m512bh qv[CHUNKS];
#pragma GCC unroll 8
    for (int c = 0; c < CHUNKS; ++c) qv[c] = (__m512bh)_mm512_loadu_si512(q + g * D + c * 32);
    int64_t s0 = 0;
    for (; s0 + 16 <= S; s0 += 16) {
      pf.step();
      vfloat acc[16];
#pragma GCC unroll 16
      for (int t = 0; t < 16; ++t) {
        const bf16* ks = k + (s0 + t) * D;
        vfloat a = vzero(), b = vzero();
#pragma GCC unroll 8
        for (int c = 0; c < CHUNKS; c += 2) {
          a = _mm512_dpbf16_ps(a, (__m512bh)_mm512_loadu_si512(ks + c * 32), qv[c]);
          if (c + 1 < CHUNKS) b = _mm512_dpbf16_ps(b, (__m512bh)_mm512_loadu_si512(ks + c * 32 + 32), qv[c + 1]);
        }
        acc[t] = vadd(a, b);
      }
      vstore(logits + g * S + s0, vmul(reduce_lanes(acc), vscale));
    }
    for (; s0 < S; ++s0) {
      vfloat a = vzero();
      for (int c = 0; c < CHUNKS; ++c) {
        a = _mm512_dpbf16_ps(a, (__m512bh)_mm512_loadu_si512(k + s0 * D + c * 32), qv[c]);
      }
      logits[g * S + s0] = vsum(a) * scale;
    }
  }
}

// p (fp32, [G][S]) -> bf16 pairs (p[g][2r], p[g][2r+1]) as uint32 at pairs[g*S/2 + r].
inline void pack_pairs_rows(const float* p, uint32_t* pairs, const Dims& d) {
  const int64_t S = d.block_size, half = S / 2;
  for (int64_t g = 0; g < d.group_size; ++g) {
    int64_t r = 0;
    for (; 2 * r + 32 <= S; r += 16) {
      const __m512bh x = _mm512_cvtne2ps_pbh(vload(p + g * S + 2 * r + 16), vload(p + g * S + 2 * r));
      _mm512_storeu_si512(pairs + g * half + r, (__m512i)x);
    }
    for (; r < half; ++r) {
      const uint16_t lo = c10::BFloat16(p[g * S + 2 * r]).x, hi = c10::BFloat16(p[g * S + 2 * r + 1]).x;
      pairs[g * half + r] = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
    }
  }
}

// o[g] = o[g] * alpha[g] + sum_s p[g][s] v[s] with vdpbf16ps on token pairs:
// rows 2r and 2r+1 of V are interleaved by unpack{lo,hi}_epi16, which permutes
// dims within each 32-dim chunk (lo: 8L+t, hi: 8L+4+t at lane 4L+t); `o` stays
// in that order until unpermute_pairs(). The pair weight of (g, r) is
// pairs[r*stride_r + g*stride_g]. CH chunks of 32 dims per tile.
template <int GB, int CH>
inline void pv_pairs_tile(const bf16* v, const uint32_t* pairs, int64_t stride_r, int64_t stride_g,
                          const float* alpha, float* o, int64_t d0, const Dims& d, const Prefetch& pf) {
  const int64_t S = d.block_size, D = d.head_dim;
  vfloat acc[GB][2 * CH];
  for (int g = 0; g < GB; ++g) {
    const vfloat a = vset1(alpha[g]);
    for (int j = 0; j < 2 * CH; ++j) acc[g][j] = vmul(vload(o + g * D + d0 + j * 16), a);
  }
  const int64_t half = S / 2;
  for (int64_t r = 0; r < half; ++r) {
    pf.step();
    const bf16* v0 = v + 2 * r * D + d0;
    __m512i lo[CH], hi[CH];
    for (int c = 0; c < CH; ++c) {
      const __m512i a = _mm512_loadu_si512(v0 + c * 32), b = _mm512_loadu_si512(v0 + D + c * 32);
      lo[c] = _mm512_unpacklo_epi16(a, b);
      hi[c] = _mm512_unpackhi_epi16(a, b);
    }
    for (int g = 0; g < GB; ++g) {
      const __m512bh w = (__m512bh)_mm512_set1_epi32(static_cast<int>(pairs[r * stride_r + g * stride_g]));
      for (int c = 0; c < CH; ++c) {
        acc[g][2 * c] = _mm512_dpbf16_ps(acc[g][2 * c], (__m512bh)lo[c], w);
        acc[g][2 * c + 1] = _mm512_dpbf16_ps(acc[g][2 * c + 1], (__m512bh)hi[c], w);
      }
    }
  }
  for (int g = 0; g < GB; ++g) {
    for (int j = 0; j < 2 * CH; ++j) vstore(o + g * D + d0 + j * 16, acc[g][j]);
  }
}

template <int GB>
struct PvPairs {
  static void run(int64_t g, const bf16* v, const uint32_t* pairs, int64_t stride_r, int64_t stride_g,
                  const float* alpha, float* o, const Dims& d, const Prefetch& pf) {
    constexpr int CH = GB <= 2 ? 4 : (GB <= 4 ? 2 : 1);  // GB*2*CH <= 16 accumulators
    const int64_t D = d.head_dim;
    const uint32_t* pg = pairs + g * stride_g;
    float* og = o + g * D;
    int64_t d0 = 0;
    for (; d0 + CH * 32 <= D; d0 += CH * 32) {
      pv_pairs_tile<GB, CH>(v, pg, stride_r, stride_g, alpha + g, og, d0, d, pf);
    }
    for (; d0 < D; d0 += 32) {
      pv_pairs_tile<GB, 1>(v, pg, stride_r, stride_g, alpha + g, og, d0, d, pf);
    }
  }
};

// Undo the dim permutation of pv_pairs_tile for one row of D floats.
inline void unpermute_pairs(float* row, int64_t D) {
  float tmp[32];
  for (int64_t c = 0; c < D; c += 32) {
    for (int j = 0; j < 32; ++j) {
      const int lane = j % 16, quad = lane / 4, t = lane % 4;
      tmp[8 * quad + (j < 16 ? 0 : 4) + t] = row[c + j];
    }
    std::copy(tmp, tmp + 32, row + c);
  }
}

#endif  // __AVX512BF16__

}  // namespace
