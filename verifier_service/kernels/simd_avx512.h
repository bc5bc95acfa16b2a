/* The AVX-512 vector mapping used by ops_simd.h (16 fp32 lanes, masked tails), with exp and tanh: Cephes'
   single-precision polynomials (max relative error ~2e-7 exp, ~3e-7 tanh), FMA evaluation, 2^n by
   vscalefps; exp's argument clamped to [-87, 88] (no overflow to inf). Reference: simd_generic.h. */
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

static inline vf v_exp(vf x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), r);
    y = _mm512_add_ps(y, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(y, n);
}

static inline vf v_tanh(vf x) {
    const __m512 a = _mm512_abs_ps(x), one = _mm512_set1_ps(1.0f);
    const __m512 e = v_exp(_mm512_add_ps(a, a));
    const __m512 big = _mm512_sub_ps(one, _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(e, one)));
    const __m512 z = _mm512_mul_ps(x, x);
    __m512 p = _mm512_set1_ps(-5.70498872745e-3f);
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(2.06390887954e-2f));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-5.37397155531e-2f));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(1.33314422036e-1f));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-3.33332819422e-1f));
    const __m512 small = _mm512_fmadd_ps(_mm512_mul_ps(p, z), x, x);
    const __m512 signed_big = _mm512_castsi512_ps(_mm512_or_si512(
        _mm512_castps_si512(big), _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32((int)0x80000000u))));
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, _mm512_set1_ps(0.625f), _CMP_GT_OQ), small, signed_big);
}
