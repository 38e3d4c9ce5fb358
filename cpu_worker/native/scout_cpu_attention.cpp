// Paged sparse decode attention on the CPU: the fast path of the CPU part.
//
// One call attends one query token of one sequence (the G query heads of each
// KV head in [head_begin, head_end)) over that head's listed blocks, reading
// the paged host cache in place through the block list (no staging copy).
// The calling Python thread releases the GIL (see the binding at the end).
// Host wrapper and validation: cpu_worker/native_kernel.py. Layout:
// scout_sglang/layout.py. LSE is natural log, fp32.
//
//   k_cache, v_cache [P, Hkv, S, D]: block (page p, head h) = S*D contiguous
//   block_table [B, Hkv, C] int32, counts [B, Hkv] int32
//   split i of n takes blocks [i*count/n, (i+1)*count/n) of every head
//
// Per block: logits = scale * q k^T, an online-softmax update in fp32, then
// o += p v. The host this was tuned on has little vector throughput per byte of
// DRAM bandwidth, so the work per token is kept small:
//   bf16 + AMX          q k^T on tiles, K rows loaded straight from the page;
//                       p v on tiles (p in bf16, V rows interleaved by pairs)
//   bf16 + AVX512_BF16  q k^T by vdpbf16ps, 16 tokens reduced by a transpose
//                       tree; p v by vdpbf16ps on token pairs (p in bf16)
//   fp16/fp32, AVX2, scalar: fp32 FMA on converted rows
// and the blocks ahead are prefetched in a trickle under the compute (class
// Prefetch). Rounding p to bf16 costs ~1e-3 absolute on o for bf16 inputs,
// well inside the bf16 tolerance; fp16/fp32 inputs stay in fp32 throughout.

#include <torch/extension.h>

#include <immintrin.h>
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using bf16 = c10::BFloat16;
using fp16 = c10::Half;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// ---------------------------------------------------------------------------
// SIMD layer: one float vector type of kLanes lanes per ISA level.
// ---------------------------------------------------------------------------
#if defined(__AVX512F__)
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

#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
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

#else
constexpr int kLanes = 1;
using vfloat = float;
inline vfloat vzero() { return 0.0f; }
inline vfloat vset1(float x) { return x; }
template <typename T>
inline vfloat vload(const T* p) { return static_cast<float>(*p); }
inline void vstore(float* p, vfloat x) { *p = x; }
inline vfloat vadd(vfloat a, vfloat b) { return a + b; }
inline vfloat vsub(vfloat a, vfloat b) { return a - b; }
inline vfloat vmul(vfloat a, vfloat b) { return a * b; }
inline vfloat vmax(vfloat a, vfloat b) { return std::max(a, b); }
inline vfloat vfma(vfloat a, vfloat b, vfloat c) { return std::fma(a, b, c); }
inline float vsum(vfloat x) { return x; }
inline float vhmax(vfloat x) { return x; }
inline vfloat vexp(vfloat x) { return std::exp(x); }
inline vfloat reduce_lanes(const vfloat* acc) { return acc[0]; }
const char* kIsa = "scalar";
#endif

#if defined(__AVX512BF16__)
constexpr bool kHasBf16Dot = true;
#else
constexpr bool kHasBf16Dot = false;
#endif

// Prefetching, two levels. Page ids are random, so the hardware prefetchers
// cannot see the next block coming:
//   near  block b + 1 into L1 while block b is computed (mostly L2 hits then);
//   far   blocks b + 2 .. b + 1 + kFarWays into L2, a 1/kFarWays slice of
//         each per block: every far block is fetched over kFarWays block
//         times, and kFarWays blocks stream at once, which keeps more DRAM
//         requests in flight than one block at a time (measured ~+15% GB/s).
constexpr int64_t kFarWays = 4;
// Prefetch steps per 16-token AMX q k^T step (it takes about as long as four
// token-pair steps of p v).
constexpr int kAmxQkSteps = 4;

struct Dims {
  int64_t group_size, block_size, head_dim;
};

// The prefetches issued while block b is computed, a few lines per step() of
// the compute loops: a burst fills the load buffer and stalls the compute,
// an even trickle keeps DRAM busy under it. finish() issues what is left.
class Prefetch {
 public:
  Prefetch(const void* const* blocks, int64_t b, int64_t total, int64_t block_bytes, int64_t steps)
      : blocks_(blocks),
        b_(b),
        total_(total),
        lines_((block_bytes + 63) / 64),
        per_step_((lines_ + steps - 1) / std::max<int64_t>(steps, 1)) {}

  inline void step() const { issue(std::min(lines_, next_ + per_step_)); }
  inline void finish() const { issue(lines_); }

  // Before the first block of a call: block 0 to L1, the far window to L2.
  static void warm_up(const void* const* blocks, int64_t total, int64_t block_bytes) {
    for (int64_t b = 0; b < std::min<int64_t>(2 + kFarWays, total); ++b) {
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
    const int64_t slice = lines_ / kFarWays, lo = next_ / kFarWays, hi = end / kFarWays;
    for (int64_t f = 0; f < kFarWays && b_ + 2 + f < total_; ++f) {
      // Block b + 2 + f takes slice kFarWays - 1 - f now: the first slice at
      // the largest distance, the last one just before it becomes near.
      const int64_t base = (kFarWays - 1 - f) * slice;
      for (int64_t line = base + lo; line < base + hi; ++line) fetch(blocks_, b_ + 2 + f, line, false);
    }
    next_ = end;
  }

  const void* const* blocks_;
  int64_t b_, total_, lines_, per_step_;
  mutable int64_t next_ = 0;
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

// ---------------------------------------------------------------------------
// Generic path (any dtype and ISA): fp32 rows, logits in [G][S].
// ---------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------
// bf16 path (AVX512_BF16): vdpbf16ps for q k^T and for p v.
// ---------------------------------------------------------------------------
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

// ---------------------------------------------------------------------------
// AMX path: q k^T and p v on tiles, logits in [S][G] (token-major).
// ---------------------------------------------------------------------------
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#define SCOUT_HAVE_AMX 1

// Linux grants AMX tile data per process on request (arch_prctl).
bool amx_permitted() {
  static const bool ok = [] {
    constexpr int kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
}

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

// ---------------------------------------------------------------------------
// One call: heads [head_begin, head_end), split `split_index` of `num_splits`.
// ---------------------------------------------------------------------------
enum class Path { kGeneric, kBf16Dot, kAmx };

template <typename T>
Path choose_path(const Dims& d) {
  if constexpr (std::is_same<T, bf16>::value && kHasBf16Dot) {
    const int64_t G = d.group_size, S = d.block_size, D = d.head_dim;
    if (D % 32 != 0 || D > 256 || S % 2 != 0) return Path::kGeneric;
#if defined(SCOUT_HAVE_AMX)
    const bool g_divides_16 = G <= 16 && 16 % G == 0;
    if (g_divides_16 && S % 16 == 0 && (S * G) % 32 == 0 && amx_permitted()) return Path::kAmx;
#endif
    return Path::kBf16Dot;
  }
  return Path::kGeneric;
}

// Number of Prefetch::step() calls per block, mirroring the loops of each path.
inline int64_t prefetch_steps(Path path, const Dims& d) {
  const int64_t G = d.group_size, S = d.block_size, D = d.head_dim;
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

template <typename T, typename O>
void attend(const T* q, const T* k_cache, const T* v_cache, const int32_t* table, const int32_t* counts,
            int64_t num_kv_heads, int64_t capacity, const Dims& d, float scale, int64_t head_begin,
            int64_t head_end, int64_t split_index, int64_t num_splits, O* out_o, float* out_lse) {
  static thread_local Scratch scratch;
  scratch.reserve(d);
  const int64_t G = d.group_size, S = d.block_size, D = d.head_dim;
  const int64_t head_stride = S * D, page_stride = num_kv_heads * head_stride;
  const Path path = choose_path<T>(d);

  // All (K, V) block pointers of this call, in order, so the loop can
  // prefetch the next one even across a head boundary.
  auto& blocks = scratch.blocks;
  auto& first = scratch.head_first;
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
  const int64_t total = static_cast<int64_t>(blocks.size() / 2);
  first[head_end - head_begin] = total;
  const int64_t block_bytes = S * D * static_cast<int64_t>(sizeof(T));
  const int64_t steps = prefetch_steps(path, d);
  Prefetch::warm_up(blocks.data(), total, block_bytes);

#if defined(SCOUT_HAVE_AMX)
  if (path == Path::kAmx) amx_configure(G);
#endif

  float* m = scratch.m.data();
  float* l = scratch.l.data();
  float* o = scratch.o.data();
  float* alpha = scratch.alpha.data();
  float* logits = scratch.logits.data();
  for (int64_t h = head_begin; h < head_end; ++h) {
    const T* qh = q + h * G * D;
    std::fill(m, m + G, kNegInf);
    std::fill(l, l + G, 0.0f);
    std::fill(o, o + G * D, 0.0f);
    if (path == Path::kGeneric) {
      for (int64_t i = 0; i < G * D; ++i) scratch.q_f32[i] = static_cast<float>(qh[i]);
    }
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
    for (int64_t b = first[h - head_begin]; b < first[h - head_begin + 1]; ++b) {
      const T* kb = static_cast<const T*>(blocks[2 * b]);
      const T* vb = static_cast<const T*>(blocks[2 * b + 1]);
      const Prefetch pf(blocks.data(), b, total, block_bytes, steps);
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
    if (path != Path::kGeneric) {
      for (int64_t g = 0; g < G; ++g) unpermute_pairs(o + g * D, D);
    }
#endif
    O* oh = out_o + h * G * D;
    for (int64_t g = 0; g < G; ++g) {
      const bool empty = l[g] == 0.0f;
      const float inv = empty ? 0.0f : 1.0f / l[g];
      for (int64_t i = 0; i < D; ++i) oh[g * D + i] = static_cast<O>(o[g * D + i] * inv);
      out_lse[h * G + g] = empty ? kNegInf : m[g] + std::log(l[g]);
    }
  }
#if defined(SCOUT_HAVE_AMX)
  if (path == Path::kAmx) _tile_release();
#endif
}

template <typename T>
void dispatch_out(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                  const torch::Tensor& block_table, const torch::Tensor& counts, int64_t batch_index,
                  const torch::Tensor& out_o, const torch::Tensor& out_lse, int64_t out_index, double scale,
                  int64_t head_begin, int64_t head_end, int64_t split_index, int64_t num_splits) {
  const int64_t num_qo_heads = q.size(1), head_dim = q.size(2);
  const int64_t num_kv_heads = k_cache.size(1), capacity = block_table.size(2);
  const Dims d{num_qo_heads / num_kv_heads, k_cache.size(2), head_dim};
  const T* qb = q.data_ptr<T>() + batch_index * num_qo_heads * head_dim;
  const int32_t* table = block_table.data_ptr<int32_t>() + batch_index * num_kv_heads * capacity;
  const int32_t* cnt = counts.data_ptr<int32_t>() + batch_index * num_kv_heads;
  float* lse = out_lse.data_ptr<float>() + out_index * num_qo_heads;
  const int64_t o_offset = out_index * num_qo_heads * head_dim;
  const float s = static_cast<float>(scale);
  if (out_o.scalar_type() == torch::kFloat32) {
    attend<T, float>(qb, k_cache.data_ptr<T>(), v_cache.data_ptr<T>(), table, cnt, num_kv_heads, capacity, d, s,
                     head_begin, head_end, split_index, num_splits, out_o.data_ptr<float>() + o_offset, lse);
  } else {
    attend<T, T>(qb, k_cache.data_ptr<T>(), v_cache.data_ptr<T>(), table, cnt, num_kv_heads, capacity, d, s,
                 head_begin, head_end, split_index, num_splits, out_o.data_ptr<T>() + o_offset, lse);
  }
}

}  // namespace

// Entry point; the host wrapper has validated every argument (kernels never
// validate). Runs with the GIL released.
void decode(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
            const torch::Tensor& block_table, const torch::Tensor& counts, int64_t batch_index,
            const torch::Tensor& out_o, const torch::Tensor& out_lse, int64_t out_index, double scale,
            int64_t head_begin, int64_t head_end, int64_t split_index, int64_t num_splits) {
  switch (q.scalar_type()) {
    case torch::kBFloat16:
      dispatch_out<bf16>(q, k_cache, v_cache, block_table, counts, batch_index, out_o, out_lse, out_index, scale,
                         head_begin, head_end, split_index, num_splits);
      break;
    case torch::kFloat16:
      dispatch_out<fp16>(q, k_cache, v_cache, block_table, counts, batch_index, out_o, out_lse, out_index, scale,
                         head_begin, head_end, split_index, num_splits);
      break;
    default:
      dispatch_out<float>(q, k_cache, v_cache, block_table, counts, batch_index, out_o, out_lse, out_index, scale,
                          head_begin, head_end, split_index, num_splits);
      break;
  }
}

// The vector ISA compiled in, and the bf16 path this process would take.
std::string isa() {
  std::string name = kIsa;
#if defined(__AVX512BF16__)
  name += "+bf16dot";
#endif
#if defined(SCOUT_HAVE_AMX)
  if (amx_permitted()) name += "+amx";
#endif
  return name;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("decode", &decode,
        "Sparse decode attention of one sequence over a range of KV heads (GIL released).",
        pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("isa", &isa, "Vector ISA the kernel was compiled for.");
}
