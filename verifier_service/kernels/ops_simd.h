/* Exact-rows attention and the exp/tanh-bound glue (SiLU and GELU-tanh products) over a vector mapping:
   included by ops_avx2.c and ops_avx512.c after their simd_<isa>.h (VL lanes, v_* operations) and a
   TQ_SUFFIX(name) macro naming the exported functions. Reference and argument docs: ops_generic.c. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "attention_rows.h"

/* q . k over d values: full VL chunks, then one zero-filled partial chunk, summed lane-wise, reduced once. */
static inline float dot(const float *q, const float *k, int64_t d) {
    vf acc = v_zero();
    int64_t c = 0;
    for (; c + VL <= d; c += VL) acc = v_fma(v_load(q + c), v_load(k + c), acc);
    if (c < d) acc = v_fma(v_loadn(q + c, d - c), v_loadn(k + c, d - c), acc);
    return v_hsum(acc);
}

/* o[0 .. chunks * VL) = (sum over j < m of s[j] * V[j * d + ...]) * vinv: one accumulator chain a VL-wide chunk
   of columns, the keys in order (chunks a constant at each call, so the chains stay in registers). */
static inline __attribute__((always_inline)) void weighted_values(const float *s, const float *V, int64_t m,
                                                                  int64_t d, vf vinv, const int chunks, float *o) {
    vf acc[8];
    for (int k = 0; k < chunks; k++) acc[k] = v_zero();
    for (int64_t j = 0; j < m; j++) {
        const vf p = v_set1(s[j]);
        for (int k = 0; k < chunks; k++) acc[k] = v_fma(p, v_load(V + j * d + k * VL), acc[k]);
    }
    for (int k = 0; k < chunks; k++) v_store(o + k * VL, v_mul(acc[k], vinv));
}

/* One (row, head) task: out row a.i, head a.h = softmax(scale * q . K) . V over its a.m keys; s: scores. */
static inline void attend_task(const attention_task a, int64_t heads, int64_t d, float scale, float *s,
                               float *out) {
    const int64_t m = a.m;
    const float *qi = a.q, *K = a.k, *V = a.v;
    int64_t j = 0;
    for (; j + 4 <= m && d % VL == 0; j += 4) {   /* four keys at a time: four independent FMA chains */
        const float *k0 = K + j * d;
        vf a0 = v_zero(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t c = 0; c < d; c += VL) {
            const vf qc = v_load(qi + c);
            a0 = v_fma(qc, v_load(k0 + c), a0);
            a1 = v_fma(qc, v_load(k0 + d + c), a1);
            a2 = v_fma(qc, v_load(k0 + 2 * d + c), a2);
            a3 = v_fma(qc, v_load(k0 + 3 * d + c), a3);
        }
        s[j] = v_hsum(a0) * scale;
        s[j + 1] = v_hsum(a1) * scale;
        s[j + 2] = v_hsum(a2) * scale;
        s[j + 3] = v_hsum(a3) * scale;
    }
    for (; j < m; j++) s[j] = dot(qi, K + j * d, d) * scale;     /* the same arithmetic per key */
    float mx = -INFINITY;
    for (int64_t j2 = 0; j2 < m; j2++) mx = s[j2] > mx ? s[j2] : mx;
    const vf vmx = v_set1(mx);
    vf vsum = v_zero();
    int64_t j2 = 0;
    for (; j2 + VL <= m; j2 += VL) {
        const vf p = v_exp(v_sub(v_load(s + j2), vmx));
        v_store(s + j2, p);
        vsum = v_add(vsum, p);
    }
    if (j2 < m) {               /* the zero-filled lanes of exp(0 - mx) are dropped before the sum */
        const vf p = v_exp(v_sub(v_loadn(s + j2, m - j2), vmx));
        v_storen(s + j2, p, m - j2);
        vsum = v_add(vsum, v_loadn(s + j2, m - j2));
    }
    const vf vinv = v_set1(1.0f / v_hsum(vsum));
    float *o = out + a.i * heads * d + a.h * d;
    int64_t c = 0;
    for (; c + 8 * VL <= d; c += 8 * VL) weighted_values(s, V + c, m, d, vinv, 8, o + c);  /* one pass */
    for (; c + 4 * VL <= d; c += 4 * VL) weighted_values(s, V + c, m, d, vinv, 4, o + c);
    for (; c < d; c += VL) {                      /* the same arithmetic for the last chunks */
        const int64_t w = d - c < VL ? d - c : VL;
        vf acc = v_zero();
        for (int64_t j3 = 0; j3 < m; j3++) acc = v_fma(v_set1(s[j3]), v_loadn(V + j3 * d + c, w), acc);
        v_storen(o + c, v_mul(acc, vinv), w);
    }
}

/* Several sessions' blocks in one parallel region (attention_rows.h); each task as tq_attention computes it. */
void TQ_SUFFIX(tq_attention_blocks)(const attention_block *b, int64_t blocks, int64_t heads, int64_t kv_heads,
                                    int64_t d, int64_t window, float scale, int threads) {
    const int64_t longest = attention_blocks_longest(b, blocks);
#pragma omp parallel num_threads(threads)
    {
        float *s = (float *)malloc(sizeof(float) * (size_t)(longest + VL));
        int64_t blk = 0, before = 0, from, to;
        attention_blocks_share(b, blocks, heads, window, tq_thread(), tq_threads(), &from, &to);
        for (int64_t t = from; t < to; t++) {
            const attention_task a = attention_blocks_task(b, t, &blk, &before, heads, kv_heads, d, window);
            attend_task(a, heads, d, scale, s, b[blk].out);
        }
        free(s);
    }
}

void TQ_SUFFIX(tq_attention)(const float *q, int64_t q_row, int64_t n, int64_t heads, int64_t kv_heads, int64_t d,
                             const float *k, const float *v, int64_t cap, int64_t start, int64_t window, float scale,
                             float *out, int threads) {
    const attention_block one = {q, q_row, n, k, v, cap, start, out};
    TQ_SUFFIX(tq_attention_blocks)(&one, 1, heads, kv_heads, d, window, scale, threads);
}

/* silu(gate) * up = (gate / (1 + exp(-gate))) * up, as torch's F.silu(g) * u. */
static inline vf silu_times(vf g, vf u) {
    return v_mul(v_div(g, v_add(v_set1(1.0f), v_exp(v_sub(v_zero(), g)))), u);
}

/* gelu_tanh(gate) * up = ((0.5 g) (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)))) * up, torch's rounding order. */
static inline vf gelu_tanh_times(vf g, vf u) {
    const vf cube = v_mul(v_mul(g, g), g);
    const vf inner = v_mul(v_set1(0.7978845608028654f), v_add(g, v_mul(v_set1(0.044715f), cube)));
    return v_mul(v_mul(v_mul(v_set1(0.5f), g), v_add(v_set1(1.0f), v_tanh(inner))), u);
}

#define GATED_PRODUCT(NAME, F)                                                                               \
    void TQ_SUFFIX(NAME)(const float *gu, int64_t n, int64_t inner, float *out) {                           \
        for (int64_t i = 0; i < n; i++) {                                                                   \
            const float *g = gu + i * 2 * inner, *u = g + inner;                                            \
            float *o = out + i * inner;                                                                     \
            int64_t j = 0;                                                                                  \
            for (; j + VL <= inner; j += VL) v_store(o + j, F(v_load(g + j), v_load(u + j)));              \
            if (j < inner) v_storen(o + j, F(v_loadn(g + j, inner - j), v_loadn(u + j, inner - j)), inner - j); \
        }                                                                                                   \
    }
GATED_PRODUCT(tq_silu_mul, silu_times)
GATED_PRODUCT(tq_gelu_tanh_mul, gelu_tanh_times)
