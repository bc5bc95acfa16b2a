/* The instances and the entry points every ISA's GEMM shares. Included at the end of a gemm_<isa>.c that
   defines ROWS (rows of x per pass, 2..8), rows_times_row(kind, N, x, inner, row, bias, y, ldy, r0, o)
   (rows r0..r0+N-1 of x against weight row o), TQ_GEMM_NAME and TQ_GEMM_PARTS_NAME (the exported names).

   One noinline function per (kind, row count): the kind and N are constants inside it, so its accumulators
   get registers and its loops unroll. The entry point runs OpenMP over tiles of OUT_TILE output columns:
   every y[r, o] is computed by one thread, and a row of x takes the same instructions in any pass it falls
   in. Within a tile, each group of ROWS rows of x meets every column before the next group starts, so the
   group's x stays in L1 across the tile's columns and the tile's weight rows stay in cache across the
   groups (column by column, a block wider than ROWS read all of x from L2 once a column: BENCHMARKS.md,
   twenty-second session). Which instance computes y[r, o] does not depend on the tile: the same bits. */
#ifndef OUT_TILE
#define OUT_TILE 16
#endif

typedef void (*rows_fn)(const float *, int64_t, const uint8_t *, const float *, float *, int64_t, int64_t, int64_t);

#define ROWS_FN(KIND, N)                                                                                        \
    static __attribute__((noinline)) void rows_##KIND##_##N(const float *x, int64_t inner, const uint8_t *row,   \
                                                           const float *bias, float *y, int64_t ldy, int64_t r0, \
                                                           int64_t o) {                                          \
        rows_times_row(KIND, N, x, inner, row, bias, y, ldy, r0, o);                                            \
    }
#if ROWS == 8
#define ROWS_FNS(KIND) ROWS_FN(KIND, 1) ROWS_FN(KIND, 2) ROWS_FN(KIND, 3) ROWS_FN(KIND, 4) \
                       ROWS_FN(KIND, 5) ROWS_FN(KIND, 6) ROWS_FN(KIND, 7) ROWS_FN(KIND, 8)
#define ROWS_TABLE(KIND) {rows_##KIND##_1, rows_##KIND##_2, rows_##KIND##_3, rows_##KIND##_4, \
                          rows_##KIND##_5, rows_##KIND##_6, rows_##KIND##_7, rows_##KIND##_8}
#elif ROWS == 4
#define ROWS_FNS(KIND) ROWS_FN(KIND, 1) ROWS_FN(KIND, 2) ROWS_FN(KIND, 3) ROWS_FN(KIND, 4)
#define ROWS_TABLE(KIND) {rows_##KIND##_1, rows_##KIND##_2, rows_##KIND##_3, rows_##KIND##_4}
#elif ROWS == 3
#define ROWS_FNS(KIND) ROWS_FN(KIND, 1) ROWS_FN(KIND, 2) ROWS_FN(KIND, 3)
#define ROWS_TABLE(KIND) {rows_##KIND##_1, rows_##KIND##_2, rows_##KIND##_3}
#elif ROWS == 2
#define ROWS_FNS(KIND) ROWS_FN(KIND, 1) ROWS_FN(KIND, 2)
#define ROWS_TABLE(KIND) {rows_##KIND##_1, rows_##KIND##_2}
#else
#error "ROWS must be 2, 3, 4 or 8"
#endif

ROWS_FNS(TQ_F32) ROWS_FNS(TQ_F16) ROWS_FNS(TQ_BF16) ROWS_FNS(TQ_Q4_0) ROWS_FNS(TQ_Q4_1) ROWS_FNS(TQ_Q5_0)
ROWS_FNS(TQ_Q5_1) ROWS_FNS(TQ_Q8_0) ROWS_FNS(TQ_Q4_K) ROWS_FNS(TQ_Q5_K) ROWS_FNS(TQ_Q6_K)
ROWS_FNS(TQ_Q4_0S) ROWS_FNS(TQ_Q4_1S) ROWS_FNS(TQ_Q5_0S) ROWS_FNS(TQ_Q5_1S) ROWS_FNS(TQ_Q8_0S)

static const rows_fn *rows_of(int kind) {
    static const rows_fn f32[] = ROWS_TABLE(TQ_F32), f16[] = ROWS_TABLE(TQ_F16), bf16[] = ROWS_TABLE(TQ_BF16),
                         q4_0[] = ROWS_TABLE(TQ_Q4_0), q4_1[] = ROWS_TABLE(TQ_Q4_1), q5_0[] = ROWS_TABLE(TQ_Q5_0),
                         q5_1[] = ROWS_TABLE(TQ_Q5_1), q8_0[] = ROWS_TABLE(TQ_Q8_0), q4_k[] = ROWS_TABLE(TQ_Q4_K),
                         q5_k[] = ROWS_TABLE(TQ_Q5_K), q6_k[] = ROWS_TABLE(TQ_Q6_K),
                         q4_0s[] = ROWS_TABLE(TQ_Q4_0S), q4_1s[] = ROWS_TABLE(TQ_Q4_1S), q5_0s[] = ROWS_TABLE(TQ_Q5_0S),
                         q5_1s[] = ROWS_TABLE(TQ_Q5_1S), q8_0s[] = ROWS_TABLE(TQ_Q8_0S);
    switch (kind) {
    case TQ_F32: return f32;
    case TQ_F16: return f16;
    case TQ_BF16: return bf16;
    case TQ_Q4_0: return q4_0;
    case TQ_Q4_1: return q4_1;
    case TQ_Q5_0: return q5_0;
    case TQ_Q5_1: return q5_1;
    case TQ_Q8_0: return q8_0;
    case TQ_Q4_K: return q4_k;
    case TQ_Q5_K: return q5_k;
    case TQ_Q6_K: return q6_k;
    case TQ_Q4_0S: return q4_0s;
    case TQ_Q4_1S: return q4_1s;
    case TQ_Q5_0S: return q5_0s;
    case TQ_Q5_1S: return q5_1s;
    case TQ_Q8_0S: return q8_0s;
    default: return 0;
    }
}

#ifdef TWO_COLUMNS
/* Two columns a pass (rows_times_two_rows, an ISA that defines TWO_COLUMNS and PAIR_ROWS) where the inner
   dimension is long: there ROWS rows of x no longer fit L1 beside the weights, and each chunk of x loaded
   serves two columns instead of one (BENCHMARKS.md, twenty-eighth session). A pair computes each y[r, o]
   with the chain of rows_times_row: the same bits as a one-column pass. */
#ifndef TWO_COLUMN_MIN_INNER
#define TWO_COLUMN_MIN_INNER 1024
#endif
typedef void (*pair_fn)(const float *, int64_t, const uint8_t *, int64_t, const float *, float *, int64_t, int64_t,
                        int64_t);

#define PAIR_FN(KIND, N)                                                                                         \
    static __attribute__((noinline)) void pair_##KIND##_##N(const float *x, int64_t inner, const uint8_t *row,    \
                                                           int64_t ldw, const float *bias, float *y, int64_t ldy, \
                                                           int64_t r0, int64_t o) {                               \
        rows_times_two_rows(KIND, N, x, inner, row, ldw, bias, y, ldy, r0, o);                                   \
    }
#if PAIR_ROWS == 4
#define PAIR_FNS(KIND) PAIR_FN(KIND, 1) PAIR_FN(KIND, 2) PAIR_FN(KIND, 3) PAIR_FN(KIND, 4)
#define PAIR_TABLE(KIND) {pair_##KIND##_1, pair_##KIND##_2, pair_##KIND##_3, pair_##KIND##_4}
#elif PAIR_ROWS == 3
#define PAIR_FNS(KIND) PAIR_FN(KIND, 1) PAIR_FN(KIND, 2) PAIR_FN(KIND, 3)
#define PAIR_TABLE(KIND) {pair_##KIND##_1, pair_##KIND##_2, pair_##KIND##_3}
#elif PAIR_ROWS == 2
#define PAIR_FNS(KIND) PAIR_FN(KIND, 1) PAIR_FN(KIND, 2)
#define PAIR_TABLE(KIND) {pair_##KIND##_1, pair_##KIND##_2}
#else
#error "PAIR_ROWS must be 2, 3 or 4"
#endif

PAIR_FNS(TQ_F32) PAIR_FNS(TQ_F16) PAIR_FNS(TQ_BF16) PAIR_FNS(TQ_Q4_0) PAIR_FNS(TQ_Q4_1) PAIR_FNS(TQ_Q5_0)
PAIR_FNS(TQ_Q5_1) PAIR_FNS(TQ_Q8_0)
PAIR_FNS(TQ_Q4_0S) PAIR_FNS(TQ_Q4_1S) PAIR_FNS(TQ_Q5_0S) PAIR_FNS(TQ_Q5_1S) PAIR_FNS(TQ_Q8_0S)

/* The kinds a pair pays for. Not the K-quants: rebuilding their chunks is heavier (shuffles, double-pumped on
   Zen 4), and doing it for two weight rows every eight FMAs cancelled the loads saved (Q4_K +4 %, Q5_K -11 %,
   Q6_K 0 at 8 rows over 1 536 weights, where F32 gained 40 % and Q4_1 47 %). */
static const pair_fn *pairs_of(int kind) {
    static const pair_fn f32[] = PAIR_TABLE(TQ_F32), f16[] = PAIR_TABLE(TQ_F16), bf16[] = PAIR_TABLE(TQ_BF16),
                         q4_0[] = PAIR_TABLE(TQ_Q4_0), q4_1[] = PAIR_TABLE(TQ_Q4_1), q5_0[] = PAIR_TABLE(TQ_Q5_0),
                         q5_1[] = PAIR_TABLE(TQ_Q5_1), q8_0[] = PAIR_TABLE(TQ_Q8_0),
                         q4_0s[] = PAIR_TABLE(TQ_Q4_0S), q4_1s[] = PAIR_TABLE(TQ_Q4_1S), q5_0s[] = PAIR_TABLE(TQ_Q5_0S),
                         q5_1s[] = PAIR_TABLE(TQ_Q5_1S), q8_0s[] = PAIR_TABLE(TQ_Q8_0S);
    switch (kind) {
    case TQ_F32: return f32;
    case TQ_F16: return f16;
    case TQ_BF16: return bf16;
    case TQ_Q4_0: return q4_0;
    case TQ_Q4_1: return q4_1;
    case TQ_Q5_0: return q5_0;
    case TQ_Q5_1: return q5_1;
    case TQ_Q8_0: return q8_0;
    case TQ_Q4_0S: return q4_0s;
    case TQ_Q4_1S: return q4_1s;
    case TQ_Q5_0S: return q5_0s;
    case TQ_Q5_1S: return q5_1s;
    case TQ_Q8_0S: return q8_0s;
    default: return 0;
    }
}
#endif

int TQ_GEMM_NAME(TQ_GEMM_ARGS) {
    const rows_fn *fns = rows_of(kind);
    if (!fns || !tq_gemm_shape_ok(kind, inner)) return -1;
    const int64_t tiles = (out + OUT_TILE - 1) / OUT_TILE;
#ifdef TWO_COLUMNS
    const pair_fn *pairs = n >= 2 && inner >= TWO_COLUMN_MIN_INNER ? pairs_of(kind) : 0;
    if (pairs) {
#pragma omp parallel for num_threads(threads) schedule(static)
        for (int64_t t = 0; t < tiles; t++) {
            const int64_t o1 = (t + 1) * OUT_TILE < out ? (t + 1) * OUT_TILE : out;
            for (int64_t r0 = 0; r0 < n; r0 += PAIR_ROWS) {
                const int k = n - r0 < PAIR_ROWS ? (int)(n - r0) : PAIR_ROWS;
                int64_t o = t * OUT_TILE;
                for (; o + 1 < o1; o += 2) pairs[k - 1](x, inner, w + o * ldw, ldw, bias, y, ldy, r0, o);
                if (o < o1) fns[k - 1](x, inner, w + o * ldw, bias, y, ldy, r0, o);
            }
        }
        return 0;
    }
#endif
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t t = 0; t < tiles; t++) {
        const int64_t o1 = (t + 1) * OUT_TILE < out ? (t + 1) * OUT_TILE : out;
        for (int64_t r0 = 0; r0 < n; r0 += ROWS) {
            const int k = n - r0 < ROWS ? (int)(n - r0) : ROWS;
            for (int64_t o = t * OUT_TILE; o < o1; o++) fns[k - 1](x, inner, w + o * ldw, bias, y, ldy, r0, o);
        }
    }
    return 0;
}

/* Several weights on one input, their outputs side by side (q, k and v; gate and up), in ONE parallel
   region: y[:, starts[p] + o] = x W_p^T for column o of part p. Each column runs the same instance with the
   same arguments as the one-weight entry above, so every bit is the same; one fork and join instead of one
   per weight (~10 us each with the Python around it). Returns 0, or -1 (a part's kind or shape refused). */
int TQ_GEMM_PARTS_NAME(int parts, const int *kinds, const uint8_t *const *ws, const int64_t *ldws,
                       const int64_t *outs, const float *x, int64_t n, int64_t inner, float *y, int64_t ldy,
                       int threads) {
    enum { MAX_PARTS = 8 };
    const rows_fn *fns[MAX_PARTS];
    int64_t starts[MAX_PARTS + 1];
    if (parts < 1 || parts > MAX_PARTS) return -1;
    starts[0] = 0;
    for (int p = 0; p < parts; p++) {
        fns[p] = rows_of(kinds[p]);
        if (!fns[p] || !tq_gemm_shape_ok(kinds[p], inner)) return -1;
        starts[p + 1] = starts[p] + outs[p];
    }
    const int64_t cols = starts[parts], tiles = (cols + OUT_TILE - 1) / OUT_TILE;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t t = 0; t < tiles; t++) {
        const int64_t c1 = (t + 1) * OUT_TILE < cols ? (t + 1) * OUT_TILE : cols;
        for (int64_t r0 = 0; r0 < n; r0 += ROWS) {
            const int k = n - r0 < ROWS ? (int)(n - r0) : ROWS;
            int p = 0;
            for (int64_t c = t * OUT_TILE; c < c1; c++) {
                while (c >= starts[p + 1]) p++;
                const int64_t o = c - starts[p];
                fns[p][k - 1](x, inner, ws[p] + o * ldws[p], 0, y + starts[p], ldy, r0, o);
            }
        }
    }
    return 0;
}
