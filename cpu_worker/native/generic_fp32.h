// Generic compute path (any dtype and ISA): q k^T and p v in fp32 FMA on
// converted rows, logits in [G][S]; and for_row_chunks, which runs a per-row-
// chunk kernel with the chunk size as a template argument.

#pragma once

#include "isa.h"
#include "prefetch.h"
#include "scratch.h"

namespace {

// logits[g*S + s] = scale * dot(q[g], k[s]) on fp32 rows.
inline void qk_f32(const float* k, const float* q, const Dims& d, float scale, float* logits) {
  const int64_t S = d.block_size, D = d.head_dim, Dv = D - D % kLanes;
  const vfloat vscale = vset1(scale);
  for (int64_t g = 0; g < d.group_size; ++g) {
    const float* qg = q + g * D;
    int64_t s0 = 0;
    for (; s0 + kLanes <= S; s0 += kLanes) {
      vfloat acc[kLanes];
      float tail[kLanes];
      for (int t = 0; t < kLanes; ++t) {
        const float* ks = k + (s0 + t) * D;
        vfloat a = vzero();
        for (int64_t c = 0; c < Dv; c += kLanes) a = vfma(vload(ks + c), vload(qg + c), a);
        acc[t] = a;
        float rest = 0.0f;
        for (int64_t c = Dv; c < D; ++c) rest += ks[c] * qg[c];
        tail[t] = rest;
      }
      vstore(logits + g * S + s0, vmul(vadd(reduce_lanes(acc), vload(tail)), vscale));
    }
    for (; s0 < S; ++s0) {
      const float* ks = k + s0 * D;
      vfloat a = vzero();
      for (int64_t c = 0; c < Dv; c += kLanes) a = vfma(vload(ks + c), vload(qg + c), a);
      float dot = vsum(a);
      for (int64_t c = Dv; c < D; ++c) dot += ks[c] * qg[c];
      logits[g * S + s0] = dot * scale;
    }
  }
}

// o[g] = o[g] * alpha[g] + sum_s p[g][s] v[s] for GB rows, dims [d0, d0 + DT*kLanes):
// GB*DT accumulators stay in registers over the block.
template <int GB, int DT, typename T>
inline void pv_f32_tile(const T* v, const float* p, const float* alpha, float* o, int64_t d0, const Dims& d,
                        const Prefetch& pf) {
  const int64_t S = d.block_size, D = d.head_dim;
  vfloat acc[GB][DT];
  for (int g = 0; g < GB; ++g) {
    const vfloat a = vset1(alpha[g]);
    for (int j = 0; j < DT; ++j) acc[g][j] = vmul(vload(o + g * D + d0 + j * kLanes), a);
  }
  for (int64_t s = 0; s < S; ++s) {
    pf.step();
    vfloat vv[DT];
    for (int j = 0; j < DT; ++j) vv[j] = vload(v + s * D + d0 + j * kLanes);
    for (int g = 0; g < GB; ++g) {
      const vfloat pg = vset1(p[g * S + s]);
      for (int j = 0; j < DT; ++j) acc[g][j] = vfma(pg, vv[j], acc[g][j]);
    }
  }
  for (int g = 0; g < GB; ++g) {
    for (int j = 0; j < DT; ++j) vstore(o + g * D + d0 + j * kLanes, acc[g][j]);
  }
}

template <int GB, typename T>
inline void pv_f32_rows(const T* v, const float* p, const float* alpha, float* o, const Dims& d, const Prefetch& pf) {
  constexpr int DT = GB <= 4 ? 4 : 2;  // GB*DT <= 16 accumulators
  const int64_t D = d.head_dim, S = d.block_size;
  int64_t d0 = 0;
  for (; d0 + DT * kLanes <= D; d0 += DT * kLanes) pv_f32_tile<GB, DT>(v, p, alpha, o, d0, d, pf);
  for (; d0 + kLanes <= D; d0 += kLanes) pv_f32_tile<GB, 1>(v, p, alpha, o, d0, d, pf);
  for (; d0 < D; ++d0) {
    for (int g = 0; g < GB; ++g) {
      float acc = o[g * D + d0] * alpha[g];
      for (int64_t s = 0; s < S; ++s) acc += p[g * S + s] * static_cast<float>(v[s * D + d0]);
      o[g * D + d0] = acc;
    }
  }
}

// Runs F<GB> over the G rows in chunks of at most 8 (GB is a template
// argument so accumulators live in registers).
template <template <int> class F, typename... Args>
inline void for_row_chunks(int64_t G, Args&&... args) {
  for (int64_t g = 0; g < G;) {
    const int64_t n = std::min<int64_t>(8, G - g);
    switch (n) {
      case 8: F<8>::run(g, args...); break;
      case 7: F<7>::run(g, args...); break;
      case 6: F<6>::run(g, args...); break;
      case 5: F<5>::run(g, args...); break;
      case 4: F<4>::run(g, args...); break;
      case 3: F<3>::run(g, args...); break;
      case 2: F<2>::run(g, args...); break;
      default: F<1>::run(g, args...); break;
    }
    g += n;
  }
}

template <int GB>
struct PvF32 {
  template <typename T>
  static void run(int64_t g, const T* v, const float* p, const float* alpha, float* o, const Dims& d,
                  const Prefetch& pf) {
    pv_f32_rows<GB>(v, p + g * d.block_size, alpha + g, o + g * d.head_dim, d, pf);
  }
};

}  // namespace
