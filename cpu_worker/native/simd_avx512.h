// SIMD layer for AVX-512F: vfloat = __m512 (16 lanes), bf16/fp16 -> fp32 loads,
// a Cephes exp for softmax arguments and a transpose-tree lane reduction.
// Included by isa.h only, when __AVX512F__ is defined.

#pragma once

namespace {

constexpr int kLanes = 16;
using vfloat = __m512;
inline vfloat vzero() { return _mm512_setzero_ps(); }
inline vfloat vset1(float x) { return _mm512_set1_ps(x); }
inline vfloat vload(const float* p) { return _mm512_loadu_ps(p); }
inline vfloat vload(const bf16* p) {
  // bf16 -> fp32 is a 16-bit left shift of the bit pattern.
  __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}
inline vfloat vload(const fp16* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
// 32 bf16 -> the even elements (lane i = p[2i]) and the odd ones (p[2i+1]):
// bf16 is the high half of an fp32, so a shift and a mask, no lane crossing.
inline void vload_split(const bf16* p, vfloat& even, vfloat& odd) {
  const __m512i x = _mm512_loadu_si512(p);
  even = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
  odd = _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
}
inline void vstore(float* p, vfloat x) { _mm512_storeu_ps(p, x); }
inline vfloat vadd(vfloat a, vfloat b) { return _mm512_add_ps(a, b); }
inline vfloat vsub(vfloat a, vfloat b) { return _mm512_sub_ps(a, b); }
inline vfloat vmul(vfloat a, vfloat b) { return _mm512_mul_ps(a, b); }
inline vfloat vmax(vfloat a, vfloat b) { return _mm512_max_ps(a, b); }
inline vfloat vfma(vfloat a, vfloat b, vfloat c) { return _mm512_fmadd_ps(a, b, c); }
inline float vsum(vfloat x) { return _mm512_reduce_add_ps(x); }
inline float vhmax(vfloat x) { return _mm512_reduce_max_ps(x); }

// exp(x) for softmax arguments (x <= 0): Cephes polynomial, 2^n by scalef,
// which underflows to 0 correctly for very negative x.
inline vfloat vexp(vfloat x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
  vfloat n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  vfloat r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  vfloat p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

// out lane i = sum of the lanes of acc[i]: a transpose-add tree, 45 ops for
// 16 dot products instead of ~9 per horizontal reduction.
inline vfloat reduce_lanes(const vfloat* acc) {
  vfloat c[8], d[4], e[2];
  for (int i = 0; i < 8; ++i) {
    c[i] = _mm512_add_ps(_mm512_unpacklo_ps(acc[2 * i], acc[2 * i + 1]),
                         _mm512_unpackhi_ps(acc[2 * i], acc[2 * i + 1]));
  }
  for (int i = 0; i < 4; ++i) {
    __m512d a = _mm512_castps_pd(c[2 * i]), b = _mm512_castps_pd(c[2 * i + 1]);
    d[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  for (int i = 0; i < 2; ++i) {
    e[i] = _mm512_add_ps(_mm512_shuffle_f32x4(d[2 * i], d[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(d[2 * i], d[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  }
  return _mm512_add_ps(_mm512_shuffle_f32x4(e[0], e[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(e[0], e[1], _MM_SHUFFLE(3, 1, 3, 1)));
}
const char* kIsa = "avx512";

}  // namespace
