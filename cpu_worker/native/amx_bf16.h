// bf16 compute path on AMX tiles: q k^T and p v by tdpbf16ps, logits in [S][G]
// (token-major; their softmax is softmax_tokens in online_softmax.h). Empty
// unless SCOUT_HAVE_AMX (isa.h).

#pragma once

#include "isa.h"
#include "prefetch.h"
#include "scratch.h"

namespace {

#if defined(SCOUT_HAVE_AMX)

struct alignas(64) TileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles: 0 = logits C [16 tokens x G] fp32, 1 = K rows A [16 x 32 bf16] and
// V pairs B [16 token pairs x 16 dims], 2..5 = q pairs B [16 dim pairs x G]
// (one per 32 dims, resident when D <= 128), 6 = P A [G x 32 tokens bf16],
// 7 = O C [G x 16 dims] fp32.
inline void amx_configure(int64_t G) {
  TileConfig cfg;
  cfg.rows[0] = 16;
  cfg.colsb[0] = static_cast<uint16_t>(G * 4);
  cfg.rows[1] = 16;
  cfg.colsb[1] = 64;
  for (int t = 2; t < 6; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = static_cast<uint16_t>(G * 4);
  }
  for (int t = 6; t < 8; ++t) {
    cfg.rows[t] = static_cast<uint8_t>(G);
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
}

// q [G][D] bf16 -> B layout: q_pairs[r*G + g] = (q[g][2r], q[g][2r+1]).
inline void pack_q_pairs(const bf16* q, uint32_t* q_pairs, const Dims& d) {
  const int64_t G = d.group_size, half = d.head_dim / 2;
  const uint32_t* q32 = reinterpret_cast<const uint32_t*>(q);
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t r = 0; r < half; ++r) q_pairs[r * G + g] = q32[g * half + r];
  }
}

template <int CHUNKS>
inline void amx_load_q(const uint32_t* q_pairs, int64_t G) {
  const int64_t stride = G * 4;
  if (CHUNKS >= 1) _tile_loadd(2, q_pairs, stride);
  if (CHUNKS >= 2) _tile_loadd(3, q_pairs + 16 * G, stride);
  if (CHUNKS >= 3) _tile_loadd(4, q_pairs + 32 * G, stride);
  if (CHUNKS >= 4) _tile_loadd(5, q_pairs + 48 * G, stride);
}

// logits_t[s*G + g] = dot(q[g], k[s]) (unscaled); S % 16 == 0, D = 32*CHUNKS.
// CHUNKS 1-4 keep q in tiles 2-5; 0 reloads them from q_pairs (any D).
template <int CHUNKS>
inline void qk_amx(const bf16* k, const uint32_t* q_pairs, const Dims& d, float* logits_t, const Prefetch& pf) {
  const int64_t S = d.block_size, D = d.head_dim, G = d.group_size;
  for (int64_t s0 = 0; s0 < S; s0 += 16) {
    for (int i = 0; i < kAmxQkSteps; ++i) pf.step();
    const bf16* ks = k + s0 * D;
    _tile_zero(0);
    if constexpr (CHUNKS > 0) {
      _tile_loadd(1, ks, D * 2);
      _tile_dpbf16ps(0, 1, 2);
      if constexpr (CHUNKS >= 2) {
        _tile_loadd(1, ks + 32, D * 2);
        _tile_dpbf16ps(0, 1, 3);
      }
      if constexpr (CHUNKS >= 3) {
        _tile_loadd(1, ks + 64, D * 2);
        _tile_dpbf16ps(0, 1, 4);
      }
      if constexpr (CHUNKS >= 4) {
        _tile_loadd(1, ks + 96, D * 2);
        _tile_dpbf16ps(0, 1, 5);
      }
    } else {
      for (int64_t c = 0; c < D / 32; ++c) {
        _tile_loadd(1, ks + c * 32, D * 2);
        _tile_loadd(2, q_pairs + c * 16 * G, G * 4);
        _tile_dpbf16ps(0, 1, 2);
      }
    }
    _tile_stored(0, logits_t + s0 * G, G * 4);
  }
}

// o[g] = o[g] * alpha[g] + sum_s p[g][s] v[s] on tiles, S % 32 == 0. P comes
// from the token-major pairs of softmax_tokens; each 32-dim chunk of 32 V rows
// is interleaved by token pair (unpack{lo,hi}_epi16, the dim order of
// pv_pairs_tile, undone by unpermute_pairs) into two B tiles in `v_tiles`.
inline void pv_amx(const bf16* v, const uint32_t* pairs, uint32_t* pairs_g, uint32_t* v_tiles, const float* alpha,
                   float* o, const Dims& d, const Prefetch& pf) {
  const int64_t G = d.group_size, S = d.block_size, D = d.head_dim, half = S / 2;
  for (int64_t r = 0; r < half; ++r) {
    for (int64_t g = 0; g < G; ++g) pairs_g[g * half + r] = pairs[r * G + g];
  }
  for (int64_t g = 0; g < G; ++g) {
    const vfloat a = vset1(alpha[g]);
    for (int64_t i = 0; i < D; i += 16) vstore(o + g * D + i, vmul(vload(o + g * D + i), a));
  }
  for (int64_t j = 0; j < S; j += 32) {
    _tile_loadd(6, pairs_g + j / 2, half * 4);
    for (int64_t c = 0; c < D; c += 32) {
      pf.step();
      const bf16* rows = v + j * D + c;
      for (int r = 0; r < 16; ++r) {
        const __m512i x = _mm512_loadu_si512(rows + 2 * r * D), y = _mm512_loadu_si512(rows + (2 * r + 1) * D);
        _mm512_store_si512(v_tiles + r * 16, _mm512_unpacklo_epi16(x, y));
        _mm512_store_si512(v_tiles + 256 + r * 16, _mm512_unpackhi_epi16(x, y));
      }
      for (int h = 0; h < 2; ++h) {
        _tile_loadd(7, o + c + 16 * h, D * 4);
        _tile_loadd(1, v_tiles + 256 * h, 64);
        _tile_dpbf16ps(7, 6, 1);
        _tile_stored(7, o + c + 16 * h, D * 4);
      }
    }
  }
}
#endif  // AMX

}  // namespace
