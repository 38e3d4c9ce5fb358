// ISA detection for the native CPU attention kernel: the element types, the
// float vector layer of the widest ISA compiled in (simd_avx512.h, simd_avx2.h
// or simd_scalar.h), the bf16 dot-product flag, and whether AMX tiles are
// compiled in (SCOUT_HAVE_AMX) and granted to this process (amx_permitted).

#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <immintrin.h>
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace {

using bf16 = c10::BFloat16;
using fp16 = c10::Half;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

}  // namespace

// The SIMD layer: one float vector type `vfloat` of kLanes lanes per ISA level,
// with loads that convert bf16/fp16 rows to fp32, and the name kIsa.
// SCOUT_HAVE_SPLIT: the layer has vload_split (widened bf16 loads, split_bf16.h).
#if defined(__AVX512F__)
#include "simd_avx512.h"
#define SCOUT_HAVE_SPLIT 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "simd_avx2.h"
#define SCOUT_HAVE_SPLIT 1
#else
#include "simd_scalar.h"
#endif

namespace {

#if defined(__AVX512BF16__)
constexpr bool kHasBf16Dot = true;
#else
constexpr bool kHasBf16Dot = false;
#endif

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
#endif  // AMX

}  // namespace
