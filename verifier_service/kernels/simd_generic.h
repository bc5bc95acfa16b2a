/* exp and tanh in plain C for the portable path: branch-free fp32 arithmetic (selects, no calls), so loops
   over them vectorise on any ISA. Cephes' single-precision polynomials, as the SIMD headers use, with each
   product and sum rounded separately (-ffp-contract=off): max relative error ~2e-7 (exp), ~3e-7 (tanh). */
#pragma once
#include <stdint.h>
#include <string.h>

#define TQ_EXP_LO (-87.0f)   /* exp's argument is clamped to [TQ_EXP_LO, TQ_EXP_HI]: no overflow to inf */
#define TQ_EXP_HI 88.0f

static inline float tq_expf(float x) {
    x = x < TQ_EXP_LO ? TQ_EXP_LO : x;
    x = x > TQ_EXP_HI ? TQ_EXP_HI : x;
    /* n = round(x / ln 2): adding and subtracting 1.5 * 2^23 rounds to the nearest integer (|x / ln 2| < 2^22) */
    const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float y = 1.9875691500e-4f;
    y = y * r + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = y * (r * r) + r;
    y = y + 1.0f;
    const uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;   /* 2^n, n in [-126, 127] */
    float p;
    memcpy(&p, &bits, 4);
    return y * p;
}

/* tanh: x + x^3 P(x^2) for |x| <= 0.625, else sign(x) (1 - 2 / (exp(2|x|) + 1)). */
static inline float tq_tanhf(float x) {
    const float a = x < 0.0f ? -x : x;
    const float e = tq_expf(2.0f * a);
    float big = 1.0f - 2.0f / (e + 1.0f);
    big = x < 0.0f ? -big : big;
    const float z = x * x;
    float p = -5.70498872745e-3f;
    p = p * z + 2.06390887954e-2f;
    p = p * z - 5.37397155531e-2f;
    p = p * z + 1.33314422036e-1f;
    p = p * z - 3.33332819422e-1f;
    const float small = p * z * x + x;
    return a > 0.625f ? big : small;
}
