// Online-softmax state updates (running max m, sum l, rescale alpha per query
// row) for one block of logits: softmax_rows for row-major logits [G][S], and
// for the AMX path softmax_tokens over token-major logits [S][G], which also
// packs the probabilities into bf16 pairs.

#pragma once

#include "isa.h"
#include "scratch.h"

namespace {

// Online softmax over one block's logits [G][S] (in place -> probabilities).
inline void softmax_rows(float* logits, float* m, float* l, float* alpha, const Dims& d) {
  const int64_t S = d.block_size, Sv = S - S % kLanes;
  for (int64_t g = 0; g < d.group_size; ++g) {
    float* row = logits + g * S;
    float block_max = kNegInf;
    if (Sv > 0) {
      vfloat vm = vload(row);
      for (int64_t s = kLanes; s < Sv; s += kLanes) vm = vmax(vm, vload(row + s));
      block_max = vhmax(vm);
    }
    for (int64_t s = Sv; s < S; ++s) block_max = std::max(block_max, row[s]);
    const float m_new = std::max(m[g], block_max);
    alpha[g] = m[g] == kNegInf ? 0.0f : std::exp(m[g] - m_new);
    const vfloat vmn = vset1(m_new);
    vfloat vs = vzero();
    for (int64_t s = 0; s < Sv; s += kLanes) {
      const vfloat e = vexp(vsub(vload(row + s), vmn));
      vstore(row + s, e);
      vs = vadd(vs, e);
    }
    float sum = vsum(vs);
    for (int64_t s = Sv; s < S; ++s) {
      row[s] = std::exp(row[s] - m_new);
      sum += row[s];
    }
    l[g] = l[g] * alpha[g] + sum;
    m[g] = m_new;
  }
}

#if defined(SCOUT_HAVE_AMX)
// Lane i of the result combines all lanes j with j % G == i % G (G | 16).
template <bool kMax>
inline vfloat reduce_strided(vfloat x, int64_t G) {
  for (int shift = 8; shift >= G; shift >>= 1) {
    const __m512i idx = _mm512_xor_si512(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                         _mm512_set1_epi32(shift));
    const vfloat y = _mm512_permutexvar_ps(idx, x);
    x = kMax ? _mm512_max_ps(x, y) : _mm512_add_ps(x, y);
  }
  return x;
}

// Online softmax over logits_t [S][G] (G | 16, S*G % 32 == 0), scale applied
// here; writes bf16 probability pairs pairs[r*G + g] = (p[2r][g], p[2r+1][g]).
inline void softmax_tokens(float* logits_t, float scale, float* m, float* l, float* alpha, uint32_t* pairs,
                           const Dims& d) {
  const int64_t G = d.group_size, n = d.block_size * G;
  float pattern[16];
  for (int i = 0; i < 16; ++i) pattern[i] = m[i % G];
  const vfloat m_old = vload(pattern);
  const vfloat vscale = vset1(scale);
  vfloat vm = vset1(kNegInf);
  for (int64_t i = 0; i < n; i += 16) vm = vmax(vm, vload(logits_t + i));
  // scale > 0, so max(scale * x) = scale * max(x).
  const vfloat m_new = vmax(m_old, vmul(reduce_strided<true>(vm, G), vscale));
  const __mmask16 fresh = _mm512_cmp_ps_mask(m_old, vset1(kNegInf), _CMP_EQ_OQ);
  const vfloat a = _mm512_mask_blend_ps(fresh, vexp(vsub(m_old, m_new)), vzero());
  // Pair index table: output uint32 lane j = r*G + g <- bf16 (2rG + g, 2rG + G + g).
  alignas(64) uint16_t idx_table[32];
  for (int j = 0; j < 16; ++j) {
    const int r = j / static_cast<int>(G), g = j % static_cast<int>(G);
    idx_table[2 * j] = static_cast<uint16_t>(2 * r * G + g);
    idx_table[2 * j + 1] = static_cast<uint16_t>(2 * r * G + G + g);
  }
  const __m512i idx = _mm512_load_si512(idx_table);
  vfloat vs = vzero();
  for (int64_t i = 0; i < n; i += 32) {
    const vfloat e0 = vexp(vsub(vmul(vload(logits_t + i), vscale), m_new));
    const vfloat e1 = vexp(vsub(vmul(vload(logits_t + i + 16), vscale), m_new));
    vs = vadd(vs, vadd(e0, e1));
    const __m512i packed = (__m512i)_mm512_cvtne2ps_pbh(e1, e0);
    _mm512_storeu_si512(pairs + i / 2, _mm512_permutexvar_epi16(idx, packed));
  }
  const vfloat sum = reduce_strided<false>(vs, G);
  float out_m[16], out_a[16], out_s[16];
  vstore(out_m, m_new);
  vstore(out_a, a);
  vstore(out_s, sum);
  for (int64_t g = 0; g < G; ++g) {
    alpha[g] = out_a[g];
    l[g] = l[g] * out_a[g] + out_s[g];
    m[g] = out_m[g];
  }
}
#endif  // AMX

}  // namespace
