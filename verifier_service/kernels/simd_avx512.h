/* The AVX-512 vector mapping used by ops_simd.h (16 fp32 lanes, masked tails); exp and tanh over it in
   simd_math.h, 2^n by vscalefps. Reference: simd_generic.h. */
#pragma once
#include <immintrin.h>

#define VL 16
typedef __m512 vf;

static inline __mmask16 v_mask(int64_t n) { return n >= VL ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1u); }
static inline vf v_zero(void) { return _mm512_setzero_ps(); }
static inline vf v_set1(float a) { return _mm512_set1_ps(a); }
static inline vf v_load(const float *p) { return _mm512_loadu_ps(p); }
static inline vf v_loadn(const float *p, int64_t n) { return _mm512_maskz_loadu_ps(v_mask(n), p); }
static inline void v_store(float *p, vf a) { _mm512_storeu_ps(p, a); }
static inline void v_storen(float *p, vf a, int64_t n) { _mm512_mask_storeu_ps(p, v_mask(n), a); }
static inline vf v_fma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline vf v_add(vf a, vf b) { return _mm512_add_ps(a, b); }
static inline vf v_sub(vf a, vf b) { return _mm512_sub_ps(a, b); }
static inline vf v_mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
static inline vf v_div(vf a, vf b) { return _mm512_div_ps(a, b); }
static inline float v_hsum(vf a) { return _mm512_reduce_add_ps(a); }

static inline vf v_min(vf a, vf b) { return _mm512_min_ps(a, b); }
static inline vf v_max(vf a, vf b) { return _mm512_max_ps(a, b); }
static inline vf v_fnma(vf a, vf b, vf c) { return _mm512_fnmadd_ps(a, b, c); }
static inline vf v_round(vf a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
static inline vf v_abs(vf a) { return _mm512_abs_ps(a); }
/* y * 2^n for integral n: vscalefps */
static inline vf v_pow2_mul(vf y, vf n) { return _mm512_scalef_ps(y, n); }
/* a with the sign bit of s or-ed in */
static inline vf v_or_sign(vf a, vf s) {
    return _mm512_castsi512_ps(_mm512_or_si512(
        _mm512_castps_si512(a), _mm512_and_si512(_mm512_castps_si512(s), _mm512_set1_epi32((int)0x80000000u))));
}
/* where a > t: b, else s */
static inline vf v_select_gt(vf a, float t, vf s, vf b) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, _mm512_set1_ps(t), _CMP_GT_OQ), s, b);
}

#include "simd_math.h"
