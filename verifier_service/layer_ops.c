/* The decoder layer's row-wise glue in C (issue 14): residual add + RMSNorm, RoPE + KV-cache store, SiLU-gated
   product. Each replaces several torch calls per layer (a width-1 step spent ~3 ms of 13 in such calls on
   the AMD EPYC). Every row is computed on its own with the same code, so rows stay exact across block
   widths; single-threaded (these are microseconds: an OpenMP fork would cost more).

   Numerics: RoPE rounds as torch's x * cos + rotate_half(x) * sin (built with -ffp-contract=off); RMSNorm
   is w * (x * (1 / sqrt(mean(x^2) + eps))) with a sequential sum (torch reduces in another order: ~1e-7);
   SiLU is x / (1 + exp(-x)) with simd_exp.h's exp. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "simd_exp.h"

int layer_ops_abi(void) { return 1; }

/* x [n, dim] += y (when y is not NULL); h = RMSNorm(x) * w. */
void add_rms_norm(float *x, const float *y, int64_t n, int64_t dim, const float *w, float eps, float *h) {
    for (int64_t i = 0; i < n; i++) {
        float *xi = x + i * dim;
        if (y) {
            const float *yi = y + i * dim;
            for (int64_t j = 0; j < dim; j++) xi[j] = xi[j] + yi[j];
        }
        float ss = 0.0f;
        for (int64_t j = 0; j < dim; j++) ss += xi[j] * xi[j];
        const float r = 1.0f / sqrtf(ss / (float)dim + eps);
        float *hi = h + i * dim;
        for (int64_t j = 0; j < dim; j++) hi[j] = w[j] * (xi[j] * r);
    }
}

static inline void rope(const float *x, const float *c, const float *s, int64_t d, float *out) {
    const int64_t half = d / 2;
    for (int64_t j = 0; j < half; j++) out[j] = x[j] * c[j] + (-x[j + half]) * s[j];
    for (int64_t j = half; j < d; j++) out[j] = x[j] * c[j] + x[j - half] * s[j];
}

/* qkv [n, (heads + 2 kv_heads) d] (q, k, v of each row); cos/sin: [n, d] (positions start..start+n-1).
   q_out [n, heads * d] = rope(q); k_cache/v_cache [kv_heads, cap, d] at positions start + i = rope(k), v. */
void rope_store(const float *qkv, int64_t n, int64_t heads, int64_t kv_heads, int64_t d, const float *cos_,
                const float *sin_, float *k_cache, float *v_cache, int64_t cap, int64_t start, float *q_out) {
    const int64_t row = (heads + 2 * kv_heads) * d;
    for (int64_t i = 0; i < n; i++) {
        const float *r = qkv + i * row, *c = cos_ + i * d, *s = sin_ + i * d;
        for (int64_t h = 0; h < heads; h++) rope(r + h * d, c, s, d, q_out + i * heads * d + h * d);
        for (int64_t g = 0; g < kv_heads; g++) {
            const int64_t at = g * cap * d + (start + i) * d;
            rope(r + (heads + g) * d, c, s, d, k_cache + at);
            memcpy(v_cache + at, r + (heads + kv_heads + g) * d, sizeof(float) * (size_t)d);
        }
    }
}

/* gu [n, 2 inner] = [gate, up] of each row; out [n, inner] = silu(gate) * up. */
void silu_mul(const float *gu, int64_t n, int64_t inner, float *out) {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i++) {
        const float *g = gu + i * 2 * inner, *u = g + inner;
        float *o = out + i * inner;
        for (int64_t j = 0; j < inner; j += 16) {
            const __mmask16 m = inner - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (inner - j)) - 1u);
            const __m512 x = _mm512_maskz_loadu_ps(m, g + j);
            const __m512 e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), x));
            const __m512 silu = _mm512_div_ps(x, _mm512_add_ps(one, e));
            _mm512_mask_storeu_ps(o + j, m, _mm512_mul_ps(silu, _mm512_maskz_loadu_ps(m, u + j)));
        }
    }
}
