// SIMD layer without vector ISA: vfloat = float (1 lane), plain std::exp.
// Included by isa.h only, when neither AVX-512F nor AVX2 is available.

#pragma once

namespace {

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

}  // namespace
