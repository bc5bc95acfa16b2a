/* Test-only (tests/unit/test_quant_kernels.py): the AVX-512/F16C intrinsics the kernels use, emulated by SIMDe
   (header-only, Debian libsimde-dev) plus lane loops for the ones SIMDe 0.7.4 lacks, so gemm_avx512.c and
   ops_avx512.c run unchanged on a CPU without AVX-512. Copied as immintrin.h ahead of the system headers. */
#pragma once
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#include <simde/x86/f16c.h>
#include <simde/x86/fma.h>
#include <stdint.h>
#include <string.h>

#include "quants.h"          /* tq_half_to_float: binary16 -> binary32, exact */

#define _cvtsh_ss(h) tq_half_to_float((uint16_t)(h))

static inline simde__m512 shim_cvtph_ps(simde__m256i a) {
    simde__m256i_private p = simde__m256i_to_private(a); simde__m512_private r;
    for (int i = 0; i < 16; i++) r.f32[i] = tq_half_to_float((uint16_t)p.i16[i]);
    return simde__m512_from_private(r);
}
#define _mm512_cvtph_ps(a) shim_cvtph_ps(a)

static inline simde__m512i shim_cvtepu8_epi32(simde__m128i a) {
    simde__m128i_private p = simde__m128i_to_private(a); simde__m512i_private r;
    for (int i = 0; i < 16; i++) r.i32[i] = (int32_t)(uint8_t)p.i8[i];
    return simde__m512i_from_private(r);
}
static inline simde__m512i shim_cvtepi8_epi32(simde__m128i a) {
    simde__m128i_private p = simde__m128i_to_private(a); simde__m512i_private r;
    for (int i = 0; i < 16; i++) r.i32[i] = (int32_t)p.i8[i];
    return simde__m512i_from_private(r);
}
static inline simde__m512i shim_cvtepu16_epi32(simde__m256i a) {
    simde__m256i_private p = simde__m256i_to_private(a); simde__m512i_private r;
    for (int i = 0; i < 16; i++) r.i32[i] = (int32_t)(uint16_t)p.i16[i];
    return simde__m512i_from_private(r);
}
#undef _mm512_cvtepu8_epi32
#undef _mm512_cvtepi8_epi32
#undef _mm512_cvtepu16_epi32
#define _mm512_cvtepu8_epi32(a) shim_cvtepu8_epi32(a)
#define _mm512_cvtepi8_epi32(a) shim_cvtepi8_epi32(a)
#define _mm512_cvtepu16_epi32(a) shim_cvtepu16_epi32(a)

static inline simde__mmask16 shim_test_epi8_mask(simde__m128i a, simde__m128i b) {
    simde__m128i_private pa = simde__m128i_to_private(a), pb = simde__m128i_to_private(b);
    simde__mmask16 m = 0;
    for (int i = 0; i < 16; i++) m |= (simde__mmask16)(((pa.i8[i] & pb.i8[i]) != 0) << i);
    return m;
}
#define _mm_test_epi8_mask(a, b) shim_test_epi8_mask(a, b)

/* gcc's order: 256-bit halves, 128-bit halves, then within the lane */
static inline float shim_reduce_add_ps(simde__m512 a) {
    simde__m512_private p = simde__m512_to_private(a);
    float t8[8], t4[4];
    for (int i = 0; i < 8; i++) t8[i] = p.f32[i + 8] + p.f32[i];
    for (int i = 0; i < 4; i++) t4[i] = t8[i + 4] + t8[i];
    const float s0 = t4[0] + t4[1], s1 = t4[2] + t4[3];
    return s0 + s1;
}
#define _mm512_reduce_add_ps(a) shim_reduce_add_ps(a)

static inline simde__m512 shim_maskz_loadu_ps(simde__mmask16 k, const float *p) {
    simde__m512_private r;
    for (int i = 0; i < 16; i++) r.f32[i] = (k >> i) & 1 ? p[i] : 0.0f;
    return simde__m512_from_private(r);
}
static inline void shim_mask_storeu_ps(float *p, simde__mmask16 k, simde__m512 a) {
    simde__m512_private r = simde__m512_to_private(a);
    for (int i = 0; i < 16; i++) if ((k >> i) & 1) p[i] = r.f32[i];
}
#undef _mm512_maskz_loadu_ps
#undef _mm512_mask_storeu_ps
#define _mm512_maskz_loadu_ps(k, p) shim_maskz_loadu_ps(k, p)
#define _mm512_mask_storeu_ps(p, k, a) shim_mask_storeu_ps(p, k, a)

typedef simde__mmask16 __mmask16;
#ifndef _MM_FROUND_NO_EXC
#define _MM_FROUND_NO_EXC SIMDE_MM_FROUND_NO_EXC
#endif
#ifndef _MM_FROUND_TO_NEAREST_INT
#define _MM_FROUND_TO_NEAREST_INT SIMDE_MM_FROUND_TO_NEAREST_INT
#endif
static inline simde__m512 shim_cvtepi32_ps(simde__m512i a) {
    simde__m512i_private p = simde__m512i_to_private(a); simde__m512_private r;
    for (int i = 0; i < 16; i++) r.f32[i] = (float)p.i32[i];
    return simde__m512_from_private(r);
}
#undef _mm512_cvtepi32_ps
#define _mm512_cvtepi32_ps(a) shim_cvtepi32_ps(a)
