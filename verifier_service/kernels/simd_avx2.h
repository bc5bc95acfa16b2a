/* The AVX2 vector mapping used by ops_simd.h (8 fp32 lanes, masked tails by vmaskmovps), with exp and tanh:
   Cephes' single-precision polynomials (max relative error ~2e-7 exp, ~3e-7 tanh), FMA evaluation, 2^n
   built in the exponent bits; exp's argument clamped to [-87, 88] (no overflow to inf).
   Reference: simd_generic.h. */
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

static inline vf v_exp(vf x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), r);
    y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(bits));
}

static inline vf v_tanh(vf x) {
    const __m256 sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f);
    const __m256 a = _mm256_andnot_ps(sign, x);
    const __m256 e = v_exp(_mm256_add_ps(a, a));
    const __m256 big = _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, one)));
    const __m256 z = _mm256_mul_ps(x, x);
    __m256 p = _mm256_set1_ps(-5.70498872745e-3f);
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(2.06390887954e-2f));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(-5.37397155531e-2f));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(1.33314422036e-1f));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(-3.33332819422e-1f));
    const __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(p, z), x, x);
    const __m256 signed_big = _mm256_or_ps(big, _mm256_and_ps(sign, x));
    return _mm256_blendv_ps(small, signed_big, _mm256_cmp_ps(a, _mm256_set1_ps(0.625f), _CMP_GT_OQ));
}
