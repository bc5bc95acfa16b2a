/* The AVX2 vector mapping used by ops_simd.h (8 fp32 lanes, masked tails by vmaskmovps); exp and tanh
   over it in simd_math.h, 2^n built in the exponent bits. Reference: simd_generic.h. */
#pragma once
#include <immintrin.h>

#define VL 8
typedef __m256 vf;

static inline __m256i v_mask(int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n < VL ? n : VL)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
static inline vf v_zero(void) { return _mm256_setzero_ps(); }
static inline vf v_set1(float a) { return _mm256_set1_ps(a); }
static inline vf v_load(const float *p) { return _mm256_loadu_ps(p); }
static inline vf v_loadn(const float *p, int64_t n) { return _mm256_maskload_ps(p, v_mask(n)); }
static inline void v_store(float *p, vf a) { _mm256_storeu_ps(p, a); }
static inline void v_storen(float *p, vf a, int64_t n) { _mm256_maskstore_ps(p, v_mask(n), a); }
static inline vf v_fma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
static inline vf v_add(vf a, vf b) { return _mm256_add_ps(a, b); }
static inline vf v_sub(vf a, vf b) { return _mm256_sub_ps(a, b); }
static inline vf v_mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
static inline vf v_div(vf a, vf b) { return _mm256_div_ps(a, b); }
static inline float v_hsum(vf a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

static inline vf v_min(vf a, vf b) { return _mm256_min_ps(a, b); }
static inline vf v_max(vf a, vf b) { return _mm256_max_ps(a, b); }
static inline vf v_fnma(vf a, vf b, vf c) { return _mm256_fnmadd_ps(a, b, c); }
static inline vf v_round(vf a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
static inline vf v_abs(vf a) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a); }
/* y * 2^n for integral n in [-126, 127]: 2^n built in the exponent bits */
static inline vf v_pow2_mul(vf y, vf n) {
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(bits));
}
/* a with the sign bit of s or-ed in */
static inline vf v_or_sign(vf a, vf s) { return _mm256_or_ps(a, _mm256_and_ps(_mm256_set1_ps(-0.0f), s)); }
/* where a > t: b, else s */
static inline vf v_select_gt(vf a, float t, vf s, vf b) {
    return _mm256_blendv_ps(s, b, _mm256_cmp_ps(a, _mm256_set1_ps(t), _CMP_GT_OQ));
}

#include "simd_math.h"
