/* The decoder layer's attention and row-wise glue in plain C: the readable reference of ops_simd.h (AVX2,
   AVX-512) and the portable path. Lane-wise loops (16 lanes, reduced pairwise) vectorise without
   reordering any sum, so their bits do not depend on the vector width the compiler picks.

   Exact rows: each row (and each (row, head) of attention) is computed by one thread with code that does
   not depend on how many rows the call has, so a token's outputs are bit-identical in a plain step and
   inside any verify block.

   Shared by every ISA (memory-light, no exp): tq_add_rms_norm, tq_head_rms_norm, tq_rope_store. Numerics,
   against transformers' float32 modules:
     RMSNorm  w * (x * (1 / sqrt(sum(x^2) / dim + eps))): the sum in 16 lanes (torch sums in another
              order: ~1e-7 relative). Gemma's (1 + w): pass the fp32 sum 1 + w, the same rounding.
     RoPE     x * cos + rotate_half(x) * sin, each product rounded, then the sum (torch's order: equal bits).
     SiLU     g / (1 + exp(-g)), times up.   GELU-tanh  (0.5 g)(1 + tanh(sqrt(2/pi)(g + 0.044715 g^3))), times up.
              exp / tanh: Cephes' polynomials (simd_generic.h; ~2-3e-7 relative against torch's Sleef). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attention_rows.h"
#include "simd_generic.h"

#define LANES 16

static inline float lanes_sum(float *a) {
    for (int s = LANES / 2; s > 0; s /= 2)
        for (int l = 0; l < s; l++) a[l] = a[l] + a[l + s];
    return a[0];
}

/* sum of a[c] * b[c], c < d: lane c % 16, then pairwise */
static inline float dot(const float *a, const float *b, int64_t d) {
    float acc[LANES] = {0};
    int64_t c = 0;
    for (; c + LANES <= d; c += LANES)
        for (int l = 0; l < LANES; l++) acc[l] = acc[l] + a[c + l] * b[c + l];
    for (int l = 0; c + l < d; l++) acc[l] = acc[l] + a[c + l] * b[c + l];
    return lanes_sum(acc);
}

/* One (row, head) task: out row a.i, head a.h = softmax(scale * q . K) . V over its a.m keys; s: scores. */
static inline void attend_task(const attention_task a, int64_t heads, int64_t d, float scale, float *s,
                               float *out) {
    const int64_t m = a.m;
    const float *qi = a.q, *K = a.k, *V = a.v;
    float mx = -INFINITY;
    for (int64_t j = 0; j < m; j++) {
        s[j] = dot(qi, K + j * d, d) * scale;
        mx = s[j] > mx ? s[j] : mx;
    }
    float acc[LANES] = {0};
    int64_t j = 0;
    for (; j + LANES <= m; j += LANES)
        for (int l = 0; l < LANES; l++) {
            s[j + l] = tq_expf(s[j + l] - mx);
            acc[l] = acc[l] + s[j + l];
        }
    for (int l = 0; j + l < m; l++) {
        s[j + l] = tq_expf(s[j + l] - mx);
        acc[l] = acc[l] + s[j + l];
    }
    const float inv = 1.0f / lanes_sum(acc);
    float *o = out + a.i * heads * d + a.h * d;
    for (int64_t c = 0; c < d; c++) o[c] = 0.0f;
    for (int64_t j2 = 0; j2 < m; j2++)
        for (int64_t c = 0; c < d; c++) o[c] = o[c] + s[j2] * V[j2 * d + c];
    for (int64_t c = 0; c < d; c++) o[c] = o[c] * inv;
}

/* Several sessions' blocks in one parallel region (attention_rows.h): ``b[i]`` is one call's q, q_row, n, k, v,
   cap, start and out below; each task is computed as a call of its own block computes it. */
void tq_attention_blocks_generic(const attention_block *b, int64_t blocks, int64_t heads, int64_t kv_heads,
                                 int64_t d, int64_t window, float scale, int threads) {
    const int64_t longest = attention_blocks_longest(b, blocks);
#pragma omp parallel num_threads(threads)
    {
        float *s = (float *)malloc(sizeof(float) * (size_t)(longest + 1));
        int64_t blk = 0, before = 0, from, to;
        attention_blocks_share(b, blocks, heads, window, tq_thread(), tq_threads(), &from, &to);
        for (int64_t t = from; t < to; t++) {
            const attention_task a = attention_blocks_task(b, t, &blk, &before, heads, kv_heads, d, window);
            attend_task(a, heads, d, scale, s, b[blk].out);
        }
        free(s);
    }
}

/* out[i, h] = softmax(scale * q[i, h] . K[kv(h), begin..end)) . V[kv(h), begin..end), end = start + i + 1,
   begin = max(0, end - window) (window 0: 0; attention_rows.h): row i attends to its own causal prefix of
   the static cache, its last ``window`` keys with a sliding window.
   q: row i, head h at q + i * q_row + h * d (heads contiguous, any row stride); k, v: [kv_heads, cap, d] of
   one layer (head g of group h / (heads / kv_heads)); out: [n, heads * d]. Any d. */
void tq_attention_generic(const float *q, int64_t q_row, int64_t n, int64_t heads, int64_t kv_heads, int64_t d,
                          const float *k, const float *v, int64_t cap, int64_t start, int64_t window, float scale,
                          float *out, int threads) {
    const attention_block one = {q, q_row, n, k, v, cap, start, out};
    tq_attention_blocks_generic(&one, 1, heads, kv_heads, d, window, scale, threads);
}

/* gu [n, 2 inner] = [gate, up] of each row; out [n, inner] = act(gate) * up. */
void tq_silu_mul_generic(const float *gu, int64_t n, int64_t inner, float *out) {
    for (int64_t i = 0; i < n; i++) {
        const float *g = gu + i * 2 * inner, *u = g + inner;
        float *o = out + i * inner;
        for (int64_t j = 0; j < inner; j++) o[j] = (g[j] / (1.0f + tq_expf(-g[j]))) * u[j];
    }
}

void tq_gelu_tanh_mul_generic(const float *gu, int64_t n, int64_t inner, float *out) {
    for (int64_t i = 0; i < n; i++) {
        const float *g = gu + i * 2 * inner, *u = g + inner;
        float *o = out + i * inner;
        for (int64_t j = 0; j < inner; j++) {
            const float x = g[j], cube = x * x * x;
            const float t = tq_tanhf(0.7978845608028654f * (x + 0.044715f * cube));
            o[j] = ((0.5f * x) * (1.0f + t)) * u[j];
        }
    }
}

/* ---- shared by every ISA ------------------------------------------------------------------------------ */
static inline float rms_scale(const float *x, int64_t dim, float eps) {
    return 1.0f / sqrtf(dot(x, x, dim) / (float)dim + eps);
}

/* x [n, dim] += y (when y is not NULL); h [n, dim] = w * (x * rms_scale(x)). */
void tq_add_rms_norm(float *x, const float *y, int64_t n, int64_t dim, const float *w, float eps, float *h) {
    for (int64_t i = 0; i < n; i++) {
        float *xi = x + i * dim;
        if (y)
            for (int64_t j = 0; j < dim; j++) xi[j] = xi[j] + y[i * dim + j];
        const float r = rms_scale(xi, dim, eps);
        for (int64_t j = 0; j < dim; j++) h[i * dim + j] = w[j] * (xi[j] * r);
    }
}

/* RMSNorm over each head vector, in place (q/k norms of Qwen3, Gemma 3): vector h of row i at
   x + i * row + h * d, h < heads; w [d]. */
void tq_head_rms_norm(float *x, int64_t n, int64_t row, int64_t heads, int64_t d, const float *w, float eps) {
    for (int64_t i = 0; i < n; i++)
        for (int64_t h = 0; h < heads; h++) {
            float *xh = x + i * row + h * d;
            const float r = rms_scale(xh, d, eps);
            for (int64_t j = 0; j < d; j++) xh[j] = w[j] * (xh[j] * r);
        }
}

/* Rotates one head vector. cos/sin [d] in transformers' layout (the two halves repeat the same d/2 angles).
   interleaved 0: pairs (j, j + d/2) (rotate_half); 1: pairs (2j, 2j + 1), angle j, as GGUF files store
   Llama's q/k rows (transformers permutes them back to halves on load: the same products, equal bits). */
static inline void rope(const float *x, const float *c, const float *s, int64_t d, int interleaved, float *out) {
    const int64_t half = d / 2;
    if (interleaved) {
        for (int64_t j = 0; j < half; j++) {
            out[2 * j] = x[2 * j] * c[j] + (-x[2 * j + 1]) * s[j];
            out[2 * j + 1] = x[2 * j + 1] * c[j + half] + x[2 * j] * s[j + half];
        }
        return;
    }
    for (int64_t j = 0; j < half; j++) out[j] = x[j] * c[j] + (-x[j + half]) * s[j];
    for (int64_t j = half; j < d; j++) out[j] = x[j] * c[j] + x[j - half] * s[j];
}

/* qkv [n, (heads + 2 kv_heads) d] (q, k, v of each row); cos/sin [n, d] (positions start..start+n-1).
   q_out [n, heads * d] = rope(q); k_cache/v_cache [kv_heads, cap, d] at positions start + i = rope(k), v. */
void tq_rope_store(const float *qkv, int64_t n, int64_t heads, int64_t kv_heads, int64_t d, const float *cos_,
                   const float *sin_, float *k_cache, float *v_cache, int64_t cap, int64_t start, float *q_out,
                   int interleaved) {
    const int64_t row = (heads + 2 * kv_heads) * d;
    for (int64_t i = 0; i < n; i++) {
        const float *r = qkv + i * row, *c = cos_ + i * d, *s = sin_ + i * d;
        for (int64_t h = 0; h < heads; h++) rope(r + h * d, c, s, d, interleaved, q_out + i * heads * d + h * d);
        for (int64_t g = 0; g < kv_heads; g++) {
            const int64_t at = g * cap * d + (start + i) * d;
            rope(r + (heads + g) * d, c, s, d, interleaved, k_cache + at);
            memcpy(v_cache + at, r + (heads + kv_heads + g) * d, sizeof(float) * (size_t)d);
        }
    }
}
