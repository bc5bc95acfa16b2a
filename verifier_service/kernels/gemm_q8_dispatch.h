/* The q8 GEMM's instances and entry points (see gemm_q8.h), shared by every ISA as gemm_dispatch.h is by the
   fp32 GEMM. x is rounded once per call; then OpenMP runs over the output columns (y[r, o] is computed by
   one thread) in runs of OUTS columns, rows of x in passes of up to ROWS, the pass size a constant in each
   instance.

   The including file defines ROWS (2 or 4), OUTS (the weight rows one call takes: 1 or 8) and
   q8_rows_times_row(kind, N, xq, xd, xs, inner, w, ldw, m, bias, y, ldy, r0, o): rows r0..r0+N-1 of x
   against weight rows o..o+m-1, m <= OUTS (w: row o's first byte, ldw: bytes a row). */
#include "gemm_q8.h"

typedef void (*q8_rows_fn)(const int8_t *xq, const float *xd, const float *xs, int64_t inner, const uint8_t *w,
                           int64_t ldw, int m, const float *bias, float *y, int64_t ldy, int64_t r0, int64_t o);

#define Q8_ROWS_FN(KIND, N)                                                                                      \
    static __attribute__((noinline)) void q8_rows_##KIND##_##N(const int8_t *xq, const float *xd, const float *xs, \
                                                              int64_t inner, const uint8_t *w, int64_t ldw, int m,  \
                                                              const float *bias, float *y, int64_t ldy, int64_t r0, \
                                                              int64_t o) {                                        \
        q8_rows_times_row(KIND, N, xq, xd, xs, inner, w, ldw, m, bias, y, ldy, r0, o);                            \
    }
#if ROWS == 4
#define Q8_ROWS_FNS(KIND) Q8_ROWS_FN(KIND, 1) Q8_ROWS_FN(KIND, 2) Q8_ROWS_FN(KIND, 3) Q8_ROWS_FN(KIND, 4)
#define Q8_ROWS_TABLE(KIND) {q8_rows_##KIND##_1, q8_rows_##KIND##_2, q8_rows_##KIND##_3, q8_rows_##KIND##_4}
#elif ROWS == 2
#define Q8_ROWS_FNS(KIND) Q8_ROWS_FN(KIND, 1) Q8_ROWS_FN(KIND, 2)
#define Q8_ROWS_TABLE(KIND) {q8_rows_##KIND##_1, q8_rows_##KIND##_2}
#else
#error "ROWS must be 2 or 4 for the q8 GEMM"
#endif

Q8_ROWS_FNS(TQ_Q4_0) Q8_ROWS_FNS(TQ_Q4_1) Q8_ROWS_FNS(TQ_Q5_0) Q8_ROWS_FNS(TQ_Q5_1) Q8_ROWS_FNS(TQ_Q8_0)
Q8_ROWS_FNS(TQ_Q4_K) Q8_ROWS_FNS(TQ_Q5_K) Q8_ROWS_FNS(TQ_Q6_K)

static const q8_rows_fn *q8_rows_of(int kind) {
    static const q8_rows_fn q4_0[] = Q8_ROWS_TABLE(TQ_Q4_0), q4_1[] = Q8_ROWS_TABLE(TQ_Q4_1),
                            q5_0[] = Q8_ROWS_TABLE(TQ_Q5_0), q5_1[] = Q8_ROWS_TABLE(TQ_Q5_1),
                            q8_0[] = Q8_ROWS_TABLE(TQ_Q8_0), q4_k[] = Q8_ROWS_TABLE(TQ_Q4_K),
                            q5_k[] = Q8_ROWS_TABLE(TQ_Q5_K), q6_k[] = Q8_ROWS_TABLE(TQ_Q6_K);
    switch (kind) {
    case TQ_Q4_0: return q4_0;
    case TQ_Q4_1: return q4_1;
    case TQ_Q5_0: return q5_0;
    case TQ_Q5_1: return q5_1;
    case TQ_Q8_0: return q8_0;
    case TQ_Q4_K: return q4_k;
    case TQ_Q5_K: return q5_k;
    case TQ_Q6_K: return q6_k;
    default: return 0;
    }
}

/* x [n, inner] rounded row by row into one allocation: d, s, t, h, then q (h: the integer sum of each
   block's first 16 q, for Q6_K's x8 kernel). mem NULL when out of memory. */
typedef struct { int8_t *q; float *d, *s; int32_t *t, *h; void *mem; } q8_rows;

static q8_rows q8_quantize(const float *x, int64_t n, int64_t inner, int threads) {
    q8_rows r = {0, 0, 0, 0, 0, 0};
    const int64_t nb = inner / 32;
    r.mem = malloc((size_t)(n * inner + 4 * n * nb * (int64_t)sizeof(float)));
    if (!r.mem) return r;
    r.d = (float *)r.mem;
    r.s = r.d + n * nb;
    r.t = (int32_t *)(r.s + n * nb);
    r.h = r.t + n * nb;
    r.q = (int8_t *)(r.h + n * nb);
#pragma omp parallel for num_threads(threads) schedule(static) if (n * inner >= 65536)
    for (int64_t i = 0; i < n; i++)
        tq_q8_quantize_row(x + i * inner, inner, r.q + i * inner, r.d + i * nb, r.s + i * nb, r.t + i * nb,
                           r.h + i * nb);
    return r;
}

#ifdef TQ_GEMM_Q8_NAME     /* the entry points (a file that only wants q8_quantize names none) */
int TQ_GEMM_Q8_NAME(TQ_GEMM_ARGS) {
    const q8_rows_fn *fns = q8_rows_of(kind);
    if (!fns || !tq_gemm_shape_ok(kind, inner) || inner % 32) return -1;
    const q8_rows xr = q8_quantize(x, n, inner, threads);
    if (!xr.mem) return -1;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t u = 0; u < (out + OUTS - 1) / OUTS; u++) {
        const int64_t o = u * OUTS;
        const int m = out - o < OUTS ? (int)(out - o) : OUTS;
        for (int64_t r0 = 0; r0 < n; r0 += ROWS) {
            const int k = n - r0 < ROWS ? (int)(n - r0) : ROWS;
            fns[k - 1](xr.q, xr.d, xr.s, inner, w + o * ldw, ldw, m, bias, y, ldy, r0, o);
        }
    }
    free(xr.mem);
    return 0;
}

/* As tq_gemm_parts_<isa> (gemm_dispatch.h): several weights on one input side by side, x rounded once. */
int TQ_GEMM_PARTS_Q8_NAME(int parts, const int *kinds, const uint8_t *const *ws, const int64_t *ldws,
                          const int64_t *outs, const float *x, int64_t n, int64_t inner, float *y, int64_t ldy,
                          int threads) {
    enum { MAX_PARTS = 8 };
    const q8_rows_fn *fns[MAX_PARTS];
    int64_t starts[MAX_PARTS + 1], cols[MAX_PARTS + 1];
    if (parts < 1 || parts > MAX_PARTS || inner % 32) return -1;
    starts[0] = cols[0] = 0;
    for (int p = 0; p < parts; p++) {
        fns[p] = q8_rows_of(kinds[p]);
        if (!fns[p] || !tq_gemm_shape_ok(kinds[p], inner)) return -1;
        starts[p + 1] = starts[p] + (outs[p] + OUTS - 1) / OUTS;     /* runs of OUTS columns before part p */
        cols[p + 1] = cols[p] + outs[p];
    }
    const q8_rows xr = q8_quantize(x, n, inner, threads);
    if (!xr.mem) return -1;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t u = 0; u < starts[parts]; u++) {
        int p = 0;
        while (u >= starts[p + 1]) p++;
        const int64_t o = (u - starts[p]) * OUTS;
        const int m = outs[p] - o < OUTS ? (int)(outs[p] - o) : OUTS;
        for (int64_t r0 = 0; r0 < n; r0 += ROWS) {
            const int k = n - r0 < ROWS ? (int)(n - r0) : ROWS;
            fns[p][k - 1](xr.q, xr.d, xr.s, inner, ws[p] + o * ldws[p], ldws[p], m, 0, y + cols[p], ldy, r0, o);
        }
    }
    free(xr.mem);
    return 0;
}
#endif
