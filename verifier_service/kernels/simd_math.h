/* exp and tanh over a vector mapping (simd_avx2.h, simd_avx512.h): Cephes' single-precision polynomials
   (max relative error ~2e-7 exp, ~3e-7 tanh), FMA evaluation; exp's argument clamped to [-87, 88] (no
   overflow to inf). One text for every ISA, so each lane runs the same operations in the same order.
   Reference: simd_generic.h (the same polynomials, each product and sum rounded separately). */
#pragma once

static inline vf v_exp(vf x) {
    x = v_min(v_max(x, v_set1(-87.0f)), v_set1(88.0f));
    const vf n = v_round(v_mul(x, v_set1(1.44269504088896341f)));
    vf r = v_fnma(n, v_set1(0.693359375f), x);
    r = v_fnma(n, v_set1(-2.12194440e-4f), r);
    vf y = v_set1(1.9875691500e-4f);
    y = v_fma(y, r, v_set1(1.3981999507e-3f));
    y = v_fma(y, r, v_set1(8.3334519073e-3f));
    y = v_fma(y, r, v_set1(4.1665795894e-2f));
    y = v_fma(y, r, v_set1(1.6666665459e-1f));
    y = v_fma(y, r, v_set1(5.0000001201e-1f));
    y = v_fma(y, v_mul(r, r), r);
    y = v_add(y, v_set1(1.0f));
    return v_pow2_mul(y, n);
}

/* tanh: x + x^3 P(x^2) for |x| <= 0.625, else sign(x) (1 - 2 / (exp(2|x|) + 1)). */
static inline vf v_tanh(vf x) {
    const vf a = v_abs(x), one = v_set1(1.0f);
    const vf e = v_exp(v_add(a, a));
    const vf big = v_sub(one, v_div(v_set1(2.0f), v_add(e, one)));
    const vf z = v_mul(x, x);
    vf p = v_set1(-5.70498872745e-3f);
    p = v_fma(p, z, v_set1(2.06390887954e-2f));
    p = v_fma(p, z, v_set1(-5.37397155531e-2f));
    p = v_fma(p, z, v_set1(1.33314422036e-1f));
    p = v_fma(p, z, v_set1(-3.33332819422e-1f));
    const vf small = v_fma(v_mul(p, z), x, x);
    return v_select_gt(a, 0.625f, small, v_or_sign(big, x));
}
