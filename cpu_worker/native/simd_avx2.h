// SIMD layer for AVX2 + FMA + F16C: vfloat = __m256 (8 lanes), bf16/fp16 -> fp32
// loads, a Cephes exp for softmax arguments and a transpose-tree lane reduction.
// Included by isa.h only, when AVX-512F is not available.

#pragma once

namespace {

constexpr int kLanes = 8;
using vfloat = __m256;
inline vfloat vzero() { return _mm256_setzero_ps(); }
inline vfloat vset1(float x) { return _mm256_set1_ps(x); }
inline vfloat vload(const float* p) { return _mm256_loadu_ps(p); }
inline vfloat vload(const bf16* p) {
  __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}
inline vfloat vload(const fp16* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
// 16 bf16 -> the even elements (lane i = p[2i]) and the odd ones (p[2i+1]):
// bf16 is the high half of an fp32, so a shift and a mask, no lane crossing.
inline void vload_split(const bf16* p, vfloat& even, vfloat& odd) {
  const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  even = _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
  odd = _mm256_and_ps(_mm256_castsi256_ps(x), _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
}
inline void vstore(float* p, vfloat x) { _mm256_storeu_ps(p, x); }
inline vfloat vadd(vfloat a, vfloat b) { return _mm256_add_ps(a, b); }
inline vfloat vsub(vfloat a, vfloat b) { return _mm256_sub_ps(a, b); }
inline vfloat vmul(vfloat a, vfloat b) { return _mm256_mul_ps(a, b); }
inline vfloat vmax(vfloat a, vfloat b) { return _mm256_max_ps(a, b); }
inline vfloat vfma(vfloat a, vfloat b, vfloat c) { return _mm256_fmadd_ps(a, b, c); }
inline float vsum(vfloat x) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline float vhmax(vfloat x) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline vfloat vexp(vfloat x) {
  // 2^n is built in the exponent bits, so clamp where that stays normal.
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  vfloat n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  vfloat r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  vfloat p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
inline vfloat reduce_lanes(const vfloat* acc) {
  vfloat c[4], d[2];
  for (int i = 0; i < 4; ++i) {
    c[i] = _mm256_add_ps(_mm256_unpacklo_ps(acc[2 * i], acc[2 * i + 1]),
                         _mm256_unpackhi_ps(acc[2 * i], acc[2 * i + 1]));
  }
  for (int i = 0; i < 2; ++i) {
    __m256d a = _mm256_castps_pd(c[2 * i]), b = _mm256_castps_pd(c[2 * i + 1]);
    d[i] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(a, b)), _mm256_castpd_ps(_mm256_unpackhi_pd(a, b)));
  }
  return _mm256_add_ps(_mm256_permute2f128_ps(d[0], d[1], 0x20), _mm256_permute2f128_ps(d[0], d[1], 0x31));
}
const char* kIsa = "avx2";

}  // namespace
