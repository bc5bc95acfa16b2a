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
/* F(KIND, n) for n = 1 .. 2, 3, 4 or 8: one instance a row count; with an ENTRY macro (``name,``), a table. */
#define TQ_UP_TO_2(F, KIND) F(KIND, 1) F(KIND, 2)
#define TQ_UP_TO_3(F, KIND) TQ_UP_TO_2(F, KIND) F(KIND, 3)
#define TQ_UP_TO_4(F, KIND) TQ_UP_TO_3(F, KIND) F(KIND, 4)
#define TQ_UP_TO_8(F, KIND) TQ_UP_TO_4(F, KIND) F(KIND, 5) F(KIND, 6) F(KIND, 7) F(KIND, 8)
#if ROWS == 8
#define TQ_UP_TO_ROWS TQ_UP_TO_8
#elif ROWS == 4
#define TQ_UP_TO_ROWS TQ_UP_TO_4
#elif ROWS == 3
#define TQ_UP_TO_ROWS TQ_UP_TO_3
#elif ROWS == 2
#define TQ_UP_TO_ROWS TQ_UP_TO_2
#else
#error "ROWS must be 2, 3, 4 or 8"
#endif
#define ROWS_ENTRY(KIND, N) rows_##KIND##_##N,
#define ROWS_FNS(KIND) TQ_UP_TO_ROWS(ROWS_FN, KIND)
#define ROWS_TABLE(KIND) {TQ_UP_TO_ROWS(ROWS_ENTRY, KIND)}

/* The kinds every ISA's one-column pass serves: X(KIND) for each. The two-column pass serves the first list
   only (pairs_of says why). */
#define TQ_PAIRED_KINDS(X) X(TQ_F32) X(TQ_F16) X(TQ_BF16) X(TQ_Q4_0) X(TQ_Q4_1) X(TQ_Q5_0) X(TQ_Q5_1) X(TQ_Q8_0) \
                           X(TQ_Q4_0S) X(TQ_Q4_1S) X(TQ_Q5_0S) X(TQ_Q5_1S) X(TQ_Q8_0S)
#define TQ_ROW_KINDS(X) TQ_PAIRED_KINDS(X) X(TQ_Q4_K) X(TQ_Q5_K) X(TQ_Q6_K)

TQ_ROW_KINDS(ROWS_FNS)

#define ROWS_CASE(KIND)                                        \
    case KIND: {                                               \
        static const rows_fn table[] = ROWS_TABLE(KIND);       \
        return table;                                          \
    }

static const rows_fn *rows_of(int kind) {
    switch (kind) {
    TQ_ROW_KINDS(ROWS_CASE)
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
#define TQ_UP_TO_PAIR_ROWS TQ_UP_TO_4
#elif PAIR_ROWS == 3
#define TQ_UP_TO_PAIR_ROWS TQ_UP_TO_3
#elif PAIR_ROWS == 2
#define TQ_UP_TO_PAIR_ROWS TQ_UP_TO_2
#else
#error "PAIR_ROWS must be 2, 3 or 4"
#endif
#define PAIR_ENTRY(KIND, N) pair_##KIND##_##N,
#define PAIR_FNS(KIND) TQ_UP_TO_PAIR_ROWS(PAIR_FN, KIND)
#define PAIR_TABLE(KIND) {TQ_UP_TO_PAIR_ROWS(PAIR_ENTRY, KIND)}

TQ_PAIRED_KINDS(PAIR_FNS)

#define PAIR_CASE(KIND)                                        \
    case KIND: {                                               \
        static const pair_fn table[] = PAIR_TABLE(KIND);       \
        return table;                                          \
    }

/* The kinds a pair pays for. Not the K-quants: rebuilding their chunks is heavier (shuffles, double-pumped on
   Zen 4), and doing it for two weight rows every eight FMAs cancelled the loads saved (Q4_K +4 %, Q5_K -11 %,
   Q6_K 0 at 8 rows over 1 536 weights, where F32 gained 40 % and Q4_1 47 %). */
static const pair_fn *pairs_of(int kind) {
    switch (kind) {
    TQ_PAIRED_KINDS(PAIR_CASE)
    default: return 0;
    }
}
#endif

#ifdef HALF_COLUMNS
#ifndef HALF_MIN_INNER
#define HALF_MIN_INNER 2048       /* 8 rows of x: 64 KB, twice L1 */
#endif
/* The K-quants' two columns a pass, half of every chunk a pass (rows_times_two_rows_halves, an ISA that
   defines HALF_COLUMNS), from ROWS rows of x over long rows: those rows are then read half their length a
   pass, which stays in L1, and each half chunk loaded serves two columns. The same bits as a one-column pass.
   1 thread, 8 rows over 2 048 weights: Q6_K 46 -> 64 GFLOP/s, Q4_K 45 -> 50; shorter rows or fewer rows of x
   lose, as the legacy kinds do against their pairs (BENCHMARKS.md, thirty-third session). */
typedef pair_fn half_fn;
#define HALF_FN(KIND, N)                                                                                         \
    static __attribute__((noinline)) void half_##KIND##_##N(const float *x, int64_t inner, const uint8_t *row,    \
                                                           int64_t ldw, const float *bias, float *y, int64_t ldy, \
                                                           int64_t r0, int64_t o) {                               \
        rows_times_two_rows_halves(KIND, N, x, inner, row, ldw, bias, y, ldy, r0, o);                            \
    }
#define HALF_ENTRY(KIND, N) half_##KIND##_##N,
#define HALF_FNS(KIND) TQ_UP_TO_ROWS(HALF_FN, KIND)
#define HALF_TABLE(KIND) {TQ_UP_TO_ROWS(HALF_ENTRY, KIND)}

#define TQ_HALF_KINDS(X) X(TQ_Q4_K) X(TQ_Q5_K) X(TQ_Q6_K)
TQ_HALF_KINDS(HALF_FNS)

#define HALF_CASE(KIND)                                        \
    case KIND: {                                               \
        static const half_fn table[] = HALF_TABLE(KIND);       \
        return table;                                          \
    }

static const half_fn *halves_of(int kind) {
    switch (kind) {
    TQ_HALF_KINDS(HALF_CASE)
    default: return 0;
    }
}
#endif

int TQ_GEMM_NAME(TQ_GEMM_ARGS) {
    const rows_fn *fns = rows_of(kind);
    if (!fns || !tq_gemm_shape_ok(kind, inner)) return -1;
    const int64_t tiles = (out + OUT_TILE - 1) / OUT_TILE;
#ifdef TWO_COLUMNS
    /* not for PAIR_ROWS + 1 rows: a pair pass of 4 then one of 1 rebuild every chunk twice where one pass of
       5 rows rebuilds it once (SmolLM2, 1 thread, width 5: 22.7-23.3 -> 21.6-21.9 ms a forward; at 6 even,
       at 7 and 8 pairs win: BENCHMARKS.md, thirtieth session). The same bits either way. */
    const int paired_n = n != PAIR_ROWS + 1;
    const pair_fn *pairs = n >= 2 && paired_n && inner >= TWO_COLUMN_MIN_INNER ? pairs_of(kind) : 0;
    int rows = pairs ? PAIR_ROWS : ROWS;
#ifdef HALF_COLUMNS
    if (!pairs && n >= ROWS && inner >= HALF_MIN_INNER && (pairs = halves_of(kind))) rows = ROWS;
#endif
#else
    const int rows = ROWS;
#endif
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t t = 0; t < tiles; t++) {
        const int64_t o1 = (t + 1) * OUT_TILE < out ? (t + 1) * OUT_TILE : out;
        for (int64_t r0 = 0; r0 < n; r0 += rows) {
            const int k = n - r0 < rows ? (int)(n - r0) : rows;
            int64_t o = t * OUT_TILE;
#ifdef TWO_COLUMNS
            if (pairs)          /* two columns a pass; a tile's odd last column alone, with the same chain */
                for (; o + 1 < o1; o += 2) pairs[k - 1](x, inner, w + o * ldw, ldw, bias, y, ldy, r0, o);
#endif
            for (; o < o1; o++) fns[k - 1](x, inner, w + o * ldw, bias, y, ldy, r0, o);
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
