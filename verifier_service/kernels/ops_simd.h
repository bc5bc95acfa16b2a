/* Exact-rows attention and the exp/tanh-bound glue (SiLU and GELU-tanh products) over a vector mapping:
   included by ops_avx2.c and ops_avx512.c after their simd_<isa>.h (VL lanes, v_* operations) and a
   TQ_SUFFIX(name) macro naming the exported functions. Reference and argument docs: ops_generic.c. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "attention_rows.h"

/* Accumulator registers a pass of head_scores / head_values may hold: half the vector registers (AVX-512 has
   32, AVX2 16). */
#define CHAINS (VL == 16 ? 16 : 8)

/* q . k over d values: full VL chunks, then one zero-filled partial chunk, summed lane-wise, reduced once. */
static inline float dot(const float *q, const float *k, int64_t d) {
    vf acc = v_zero();
    int64_t c = 0;
    for (; c + VL <= d; c += VL) acc = v_fma(v_load(q + c), v_load(k + c), acc);
    if (c < d) acc = v_fma(v_loadn(q + c, d - c), v_loadn(k + c, d - c), acc);
    return v_hsum(acc);
}

/* s[0 .. m) = exp(s - max s) in place; returns 1 / their sum (the softmax's normaliser). */
static inline float softmax_in_place(float *s, int64_t m) {
    float mx = -INFINITY;
    for (int64_t j = 0; j < m; j++) mx = s[j] > mx ? s[j] : mx;
    const vf vmx = v_set1(mx);
    vf vsum = v_zero();
    int64_t j = 0;
    for (; j + VL <= m; j += VL) {
        const vf p = v_exp(v_sub(v_load(s + j), vmx));
        v_store(s + j, p);
        vsum = v_add(vsum, p);
    }
    if (j < m) {                /* the zero-filled lanes of exp(0 - mx) are dropped before the sum */
        const vf p = v_exp(v_sub(v_loadn(s + j, m - j), vmx));
        v_storen(s + j, p, m - j);
        vsum = v_add(vsum, v_loadn(s + j, m - j));
    }
    return 1.0f / v_hsum(vsum);
}

/* Scores of r heads (queries q, q + d, ...) against the same keys, each key read once for all of them:
   s[h * ss + j] = scale * q_h . K[j]. Per (head, key) one chain of FMAs over the VL chunks in order, reduced
   once (dot's arithmetic), however many keys and heads a pass takes. */
static inline __attribute__((always_inline)) void head_scores(const float *q, const float *K, int64_t m, int64_t d,
                                                              float scale, const int r, float *s, int64_t ss) {
    const int kj = r * 4 <= CHAINS ? 4 : r * 2 <= CHAINS ? 2 : 1;    /* keys a pass: r * kj chains */
    int64_t j = 0;
    for (; j + kj <= m && d % VL == 0; j += kj) {
        vf acc[CHAINS];
        for (int x = 0; x < r * kj; x++) acc[x] = v_zero();
        for (int64_t c = 0; c < d; c += VL) {
            for (int x = 0; x < kj; x++) {
                if (d >= 128 && (c * 4) % 64 == 0) __builtin_prefetch(K + (j + x + 4 * kj) * d + c);   /* keys ahead */
                const vf kc = v_load(K + (j + x) * d + c);
                for (int h = 0; h < r; h++) acc[h * kj + x] = v_fma(v_load(q + h * d + c), kc, acc[h * kj + x]);
            }
        }
        for (int h = 0; h < r; h++)
            for (int x = 0; x < kj; x++) s[h * ss + j + x] = v_hsum(acc[h * kj + x]) * scale;
    }
    for (; j < m; j++)
        for (int h = 0; h < r; h++) s[h * ss + j] = dot(q + h * d, K + j * d, d) * scale;
}

/* head_values' columns [c, c + n * chunks * VL) for the largest n that fits in cols, one pass over the keys
   a chunks * VL columns; returns where it stopped. */
static inline __attribute__((always_inline)) int64_t value_columns(const float *s, int64_t ss, const float *V,
                                                                   int64_t j0, int64_t j1, int64_t d, int64_t c,
                                                                   int64_t cols, const int r, const int chunks,
                                                                   float *acc) {
    for (; c + chunks * VL <= cols; c += chunks * VL) {
        vf a[CHAINS];
        for (int h = 0; h < r; h++)
            for (int k = 0; k < chunks; k++) a[h * chunks + k] = v_load(acc + h * d + c + k * VL);
        for (int64_t j = j0; j < j1; j++) {
            vf p[4];
            for (int h = 0; h < r; h++) p[h] = v_set1(s[h * ss + j]);
            for (int k = 0; k < chunks; k++) {
                if (d >= 128 && ((c + k * VL) * 4) % 64 == 0)  /* a line of the same columns of the next block */
                    __builtin_prefetch(V + (j + j1 - j0) * d + c + k * VL);
                const vf vc = v_load(V + j * d + c + k * VL);
                for (int h = 0; h < r; h++) a[h * chunks + k] = v_fma(p[h], vc, a[h * chunks + k]);
            }
        }
        for (int h = 0; h < r; h++)
            for (int k = 0; k < chunks; k++) v_store(acc + h * d + c + k * VL, a[h * chunks + k]);
    }
    return c;
}

/* acc[h * d + (0 .. cols)] += sum over keys j0 <= j < j1 of p_h[j] * V[j * d + (0 .. cols)] for r heads (p_h =
   s + h * ss; V and acc may start at a column): a block of keys whose values stay in L1 while the column
   chunks pass over them (as many a pass as the registers hold), so V streams from memory once, in order.
   Per (head, column) one chain over the keys in order, whatever the blocks, passes and column ranges. */
static inline __attribute__((always_inline)) void head_values(const float *s, int64_t ss, const float *V, int64_t j0,
                                                              int64_t j1, int64_t d, int64_t cols, const int r,
                                                              float *acc) {
    int64_t c = 0;
    if (r * 8 <= CHAINS) c = value_columns(s, ss, V, j0, j1, d, c, cols, r, 8, acc);
    if (r * 4 <= CHAINS) c = value_columns(s, ss, V, j0, j1, d, c, cols, r, 4, acc);
    c = value_columns(s, ss, V, j0, j1, d, c, cols, r, 2, acc);
    for (; c < cols; c += VL) {                   /* the last chunks, one at a time (the last one partial) */
        const int64_t w = cols - c < VL ? cols - c : VL;
        for (int h = 0; h < r; h++) {
            vf a = v_loadn(acc + h * d + c, w);
            for (int64_t j = j0; j < j1; j++) a = v_fma(v_set1(s[h * ss + j]), v_loadn(V + j * d + c, w), a);
            v_storen(acc + h * d + c, a, w);
        }
    }
}

/* o[0 .. cols) = acc[0 .. cols) * inv, VL lanes at a time (the last chunk partial). */
static inline void normalised(const float *acc, int64_t cols, float inv, float *o) {
    const vf vinv = v_set1(inv);
    int64_t c = 0;
    for (; c + VL <= cols; c += VL) v_store(o + c, v_mul(v_load(acc + c), vinv));
    if (c < cols) v_storen(o + c, v_mul(v_loadn(acc + c, cols - c), vinv), cols - c);
}

/* Columns [c0, c1) of r heads' outputs (o: head 0's output row, the others d floats apart) = (sum over the m
   keys of p_h[j] * V[j]) * inv[h], p_h = s + h * ss: the values read in blocks of keys that fit in L1
   together. acc: r * d floats of scratch. */
static inline __attribute__((always_inline)) void weigh_values(const float *s, int64_t ss, const float *V, int64_t m,
                                                               int64_t d, int64_t c0, int64_t c1, const int r,
                                                               const float *inv, float *acc, float *o) {
    const int64_t block = d >= 256 ? 16 : 4096 / d;
    for (int h = 0; h < r; h++)
        for (int64_t c = c0; c < c1; c++) acc[h * d + c] = 0.0f;
    for (int64_t j0 = 0; j0 < m; j0 += block)
        head_values(s, ss, V + c0, j0, j0 + block < m ? j0 + block : m, d, c1 - c0, r, acc + c0);
    for (int h = 0; h < r; h++) normalised(acc + h * d + c0, c1 - c0, inv[h], o + h * d + c0);
}

/* head_scores / weigh_values for r (1..4) heads: r a constant in each copy, so the chains stay in registers. */
static void scores_of(const float *q, const float *K, int64_t m, int64_t d, float scale, int r, float *s, int64_t ss) {
    switch (r) {
    case 4: head_scores(q, K, m, d, scale, 4, s, ss); break;
    case 3: head_scores(q, K, m, d, scale, 3, s, ss); break;
    case 2: head_scores(q, K, m, d, scale, 2, s, ss); break;
    default: head_scores(q, K, m, d, scale, 1, s, ss);
    }
}

static void values_of(const float *s, int64_t ss, const float *V, int64_t m, int64_t d, int64_t c0, int64_t c1, int r,
                      const float *inv, float *acc, float *o) {
    switch (r) {
    case 4: weigh_values(s, ss, V, m, d, c0, c1, 4, inv, acc, o); break;
    case 3: weigh_values(s, ss, V, m, d, c0, c1, 3, inv, acc, o); break;
    case 2: weigh_values(s, ss, V, m, d, c0, c1, 2, inv, acc, o); break;
    default: weigh_values(s, ss, V, m, d, c0, c1, 1, inv, acc, o);
    }
}

/* r (1..4) consecutive heads of one row that read the same KV head (a grouped-query model's heads share their
   cache), out row a.i, heads a.h .. a.h + r - 1 = softmax(scale * q . K) . V over the task's a.m keys: the
   keys read once and the values once for all r heads. s: r score rows of ss floats; acc: r * d floats. */
static void attend_heads(const attention_task a, int64_t heads, int64_t d, float scale, int r, float *s, int64_t ss,
                         float *acc, float *out) {
    scores_of(a.q, a.k, a.m, d, scale, r, s, ss);
    float inv[4];
    for (int h = 0; h < r; h++) inv[h] = softmax_in_place(s + h * ss, a.m);
    values_of(s, ss, a.v, a.m, d, 0, d, r, inv, acc, out + a.i * heads * d + a.h * d);
}

/* How many consecutive tasks from t (before ``to``) attend_heads takes with t: the same block, row and KV
   head, at most 4; one where 16 registers do not hold several heads' chains of a short row (AVX2, d < 128:
   slower grouped than alone, measured). */
static inline int heads_together(const attention_block *b, int64_t blk, int64_t before, int64_t t, int64_t to,
                                 int64_t heads, int64_t kv_heads, int64_t d) {
    const int64_t u = t - before, group = heads / kv_heads, h = u % heads, most = CHAINS >= 16 || d >= 128 ? 4 : 1;
    int64_t r = 1;
    while (r < most && t + r < to && u + r < b[blk].n * heads && h + r < heads && (h + r) / group == h / group) r++;
    return (int)r;
}

/* A block of up to 16 rows of a model with fewer KV heads than threads and rows of at least 128 values (Gemma 3:
   one KV head of 256), where sharing out (row, head) tasks would have each thread read the whole cache: every
   thread on each KV head. Thread t scores its share of the keys, then normalises its share of the (row, head)
   score rows, then weighs the values for its share of the columns, so each thread streams its part of the
   cache instead of all of it. Barriers between the three; every (head, key) score, softmax and (head, column)
   chain is the one attend_heads computes: the same bits. At d 64 the barriers cost more than the reads save
   (SmolLM2's shape forced onto this path, 2 threads: 0.52 -> 0.62 ms over 30 layers at 100 keys). */
static void attention_split(const attention_block *B, int64_t heads, int64_t kv_heads, int64_t d, int64_t window,
                            float scale, float *s, int64_t ss, float *inv, float *acc, int tid, int nth) {
    const int64_t group = heads / kv_heads, n = B->n;
    for (int64_t i = 0; i < n; i++)
        for (int64_t g = 0; g < kv_heads; g++) {
            const attention_task a = attention_task_of(i * heads + g * group, B->q, B->q_row, heads, kv_heads, d,
                                                       B->k, B->v, B->cap, B->start, window);
            const int64_t j0 = a.m * tid / nth, j1 = a.m * (tid + 1) / nth;
            for (int64_t h0 = 0; h0 < group; h0 += 4)
                scores_of(a.q + h0 * d, a.k + j0 * d, j1 - j0, d, scale, group - h0 < 4 ? (int)(group - h0) : 4,
                          s + (i * heads + g * group + h0) * ss + j0, ss);
        }
#pragma omp barrier
    for (int64_t t = n * heads * tid / nth; t < n * heads * (tid + 1) / nth; t++) {
        const attention_task a = attention_task_of(t, B->q, B->q_row, heads, kv_heads, d, B->k, B->v, B->cap,
                                                   B->start, window);
        inv[t] = softmax_in_place(s + t * ss, a.m);
    }
#pragma omp barrier
    const int64_t vecs = (d + VL - 1) / VL, c0 = vecs * tid / nth * VL;
    const int64_t c1 = vecs * (tid + 1) / nth * VL < d ? vecs * (tid + 1) / nth * VL : d;
    if (c0 >= c1) return;
    for (int64_t i = 0; i < n; i++)
        for (int64_t g = 0; g < kv_heads; g++) {
            const attention_task a = attention_task_of(i * heads + g * group, B->q, B->q_row, heads, kv_heads, d,
                                                       B->k, B->v, B->cap, B->start, window);
            for (int64_t h0 = 0; h0 < group; h0 += 4) {
                const int64_t row = i * heads + g * group + h0;
                values_of(s + row * ss, ss, a.v, a.m, d, c0, c1, group - h0 < 4 ? (int)(group - h0) : 4, inv + row,
                          acc, B->out + row * d);
            }
        }
}

/* Several sessions' blocks in one parallel region (attention_rows.h); each task as tq_attention computes it,
   the consecutive heads of a thread's share that read the same KV head together (attend_heads). */
void TQ_SUFFIX(tq_attention_blocks)(const attention_block *b, int64_t blocks, int64_t heads, int64_t kv_heads,
                                    int64_t d, int64_t window, float scale, int threads) {
    const int64_t longest = attention_blocks_longest(b, blocks);
    if (blocks == 1 && kv_heads < threads && d >= 128 && b[0].n <= 16) {
        const int64_t ss = longest + VL, tasks = b[0].n * heads;
        float *s = (float *)malloc(sizeof(float) * (size_t)(tasks * ss + tasks));
#pragma omp parallel num_threads(threads)
        {
            float *acc = (float *)malloc(sizeof(float) * (size_t)(4 * d));
            attention_split(b, heads, kv_heads, d, window, scale, s, ss, s + tasks * ss, acc, tq_thread(),
                            tq_threads());
            free(acc);
        }
        free(s);
        return;
    }
#pragma omp parallel num_threads(threads)
    {
        const int64_t ss = longest + VL;
        float *s = (float *)malloc(sizeof(float) * (size_t)(4 * ss + 4 * d));
        float *acc = s + 4 * ss;
        int64_t blk = 0, before = 0, from, to;
        attention_blocks_share(b, blocks, heads, window, tq_thread(), tq_threads(), &from, &to);
        for (int64_t t = from; t < to;) {
            const attention_task a = attention_blocks_task(b, t, &blk, &before, heads, kv_heads, d, window);
            const int r = heads_together(b, blk, before, t, to, heads, kv_heads, d);
            attend_heads(a, heads, d, scale, r, s, ss, acc, b[blk].out);
            t += r;
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
