/* The int8-activation GEMM on the x8 layout (gemm_q8.h: 8 weight rows interleaved) for Q4_0, Q4_1, Q8_0
   and Q4_K, x86 paths. Per 32-weight chunk: one conversion gives the 8 rows' scales, and per lane l one
   32-byte load gives weights 4l..4l+3 of the 8 rows; x's 4 bytes 4l..4l+3 are broadcast to every lane, so
   vpmaddubsw + vpmaddwd give lane l's exact integer sum for the 8 rows at once, and accumulator A[l]
   holds lane l of 8 outputs. The per-output operations are gemm_q8.h's, in its order, so each y[r, o]
   is bit-identical to the one-row-at-a-time kernel (and to gemm_q8_generic.c). Rows of x one at a time
   (8 accumulators a row; the group's chunks stay in L1 between rows).

   Included after gemm_q8_dispatch.h (for q8_quantize) by gemm_q8_<x86 isa>.c, which names the entry
   points TQ_GEMM_Q8X8_NAME and TQ_GEMM_PARTS_Q8X8_NAME. */

/* gemm_q8.h's sum of the lanes, for 8 outputs at once: ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)) + msum. */
static inline __m256 q8x8_total(const __m256 *A, __m256 MS) {
    return _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(_mm256_add_ps(A[0], A[4]), _mm256_add_ps(A[2], A[6])),
                                       _mm256_add_ps(_mm256_add_ps(A[1], A[5]), _mm256_add_ps(A[3], A[7]))), MS);
}

/* Q4_K: row r against group g, per super-block: the 8 rows' d * sc and -(dmin * m) of each chunk from the
   unpacked bytes (the products quants.h's tq_k4_decode makes), then chunk pairs from one byte array. */
static inline __attribute__((always_inline)) __m256 q8x8_q4_k_row(const int8_t *xq, const float *xd, const float *xs,
                                                                  int64_t inner, const uint8_t *p) {
    const __m256i nib = _mm256_set1_epi8(0x0F);
    __m256 A[8], MS = _mm256_setzero_ps();
    for (int l = 0; l < 8; l++) A[l] = _mm256_setzero_ps();
    for (int64_t b = 0; b < inner / QK_K; b++) {
        const uint8_t *s8 = p + b * 8 * tq_q8x8_chunk_bytes(TQ_Q4_K);
        const __m256 D = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)s8));
        const __m256 DM = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s8 + 16)));
        for (int k = 0; k < 8; k++) {                    /* the offsets, in chunk order */
            const __m256 m = _mm256_mul_ps(DM, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(s8 + 96 + 8 * k)))));
            MS = _mm256_fmadd_ps(_mm256_xor_ps(m, _mm256_set1_ps(-0.0f)), _mm256_set1_ps(xs[8 * b + k]), MS);
        }
        for (int pr = 0; pr < 4; pr++) {
            const int64_t x0 = 8 * b + 2 * pr, x1 = x0 + 1;          /* x blocks under chunks 2pr, 2pr + 1 */
            const __m256 S0 = _mm256_mul_ps(_mm256_mul_ps(D, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
                                  _mm_loadl_epi64((const __m128i *)(s8 + 32 + 8 * (2 * pr)))))), _mm256_set1_ps(xd[x0]));
            const __m256 S1 = _mm256_mul_ps(_mm256_mul_ps(D, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
                                  _mm_loadl_epi64((const __m128i *)(s8 + 32 + 8 * (2 * pr + 1)))))), _mm256_set1_ps(xd[x1]));
            const int32_t *xa = (const int32_t *)(xq + 32 * x0), *xb = (const int32_t *)(xq + 32 * x1);
            for (int l = 0; l < 8; l++) {
                const __m256i q = _mm256_loadu_si256((const __m256i *)(s8 + 160 + 32 * (8 * pr + l)));
                const __m256i lo = _mm256_and_si256(q, nib), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), nib);
                A[l] = _mm256_fmadd_ps(S0, Q8_LANES(lo, 0, _mm256_set1_epi32(xa[l])), A[l]);
                A[l] = _mm256_fmadd_ps(S1, Q8_LANES(hi, 0, _mm256_set1_epi32(xb[l])), A[l]);
            }
        }
    }
    return q8x8_total(A, MS);
}

/* Row r of the rounded x against group g (8 weight rows; p: the group's first byte): y[r, o..o+7]. */
static inline __attribute__((always_inline)) void q8x8_group_row(int kind, const int8_t *xq, const float *xd,
                                                                 const float *xs, int64_t inner, const uint8_t *p,
                                                                 const float *bias, float *y) {
    const __m256 b8 = bias ? _mm256_loadu_ps(bias) : _mm256_setzero_ps();
    if (kind == TQ_Q4_K) {
        _mm256_storeu_ps(y, _mm256_add_ps(q8x8_q4_k_row(xq, xd, xs, inner, p), b8));
        return;
    }
    const int64_t nb = inner / 32, cb = tq_q8x8_chunk_bytes(kind);
    const int sgn = kind != TQ_Q4_1, lanes = tq_q8x8_lanes(kind), qs_at = tq_q8x8_qs_offset(kind);
    const __m256i nib = _mm256_set1_epi8(0x0F), eight = _mm256_set1_epi8(8);
    __m256 A[8], MS = _mm256_setzero_ps();
    for (int l = 0; l < 8; l++) A[l] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *c8 = p + b * cb;
        const int32_t *x4 = (const int32_t *)(xq + 32 * b);
        const __m256 S = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)c8)), _mm256_set1_ps(xd[b]));
        if (kind == TQ_Q4_1)
            MS = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(c8 + 16))), _mm256_set1_ps(xs[b]), MS);
        for (int l = 0; l < lanes; l++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(c8 + qs_at + 32 * l));
            if (kind == TQ_Q8_0) {
                A[l] = _mm256_fmadd_ps(S, Q8_LANES(q, 1, _mm256_set1_epi32(x4[l])), A[l]);
                continue;
            }
            __m256i lo = _mm256_and_si256(q, nib), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), nib);
            if (kind == TQ_Q4_0) {
                lo = _mm256_sub_epi8(lo, eight);
                hi = _mm256_sub_epi8(hi, eight);
            }
            A[l] = _mm256_fmadd_ps(S, Q8_LANES(lo, sgn, _mm256_set1_epi32(x4[l])), A[l]);
            A[l + 4] = _mm256_fmadd_ps(S, Q8_LANES(hi, sgn, _mm256_set1_epi32(x4[l + 4])), A[l + 4]);
        }
    }
    _mm256_storeu_ps(y, _mm256_add_ps(q8x8_total(A, MS), b8));
}

#define Q8X8_GROUP_FN(KIND)                                                                                     \
    static __attribute__((noinline)) void q8x8_group_##KIND(const q8_rows *xr, int64_t n, int64_t inner,         \
                                                            const uint8_t *p, const float *bias, float *y,         \
                                                            int64_t ldy) {                                        \
        const int64_t nb = inner / 32;                                                                          \
        for (int64_t r = 0; r < n; r++)                                                                         \
            q8x8_group_row(KIND, xr->q + r * inner, xr->d + r * nb, xr->s + r * nb, inner, p, bias, y + r * ldy);\
    }
Q8X8_GROUP_FN(TQ_Q4_0) Q8X8_GROUP_FN(TQ_Q4_1) Q8X8_GROUP_FN(TQ_Q8_0) Q8X8_GROUP_FN(TQ_Q4_K)

typedef void (*q8x8_group_fn)(const q8_rows *, int64_t, int64_t, const uint8_t *, const float *, float *, int64_t);

static q8x8_group_fn q8x8_group_of(int kind) {
    return kind == TQ_Q4_0 ? q8x8_group_TQ_Q4_0 : kind == TQ_Q4_1 ? q8x8_group_TQ_Q4_1
         : kind == TQ_Q8_0 ? q8x8_group_TQ_Q8_0 : kind == TQ_Q4_K ? q8x8_group_TQ_Q4_K : 0;
}

/* y = x W^T (+ bias) with W [out, inner] in the x8 layout at p (out a multiple of 8). 0, or -1. */
int TQ_GEMM_Q8X8_NAME(int kind, const float *x, int64_t n, int64_t inner, const uint8_t *p, int64_t out,
                      const float *bias, float *y, int64_t ldy, int threads) {
    const q8x8_group_fn fn = q8x8_group_of(kind);
    if (!fn || out % 8 || inner % 32 || !tq_gemm_shape_ok(kind, inner)) return -1;
    const q8_rows xr = q8_quantize(x, n, inner, threads);
    if (!xr.mem) return -1;
    const int64_t gb = inner / 32 * tq_q8x8_chunk_bytes(kind);
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t g = 0; g < out / 8; g++) fn(&xr, n, inner, p + g * gb, bias ? bias + 8 * g : 0, y + 8 * g, ldy);
    free(xr.mem);
    return 0;
}

/* Several x8 weights on one input, side by side (as tq_gemm_parts_q8_<isa>), x rounded once. */
int TQ_GEMM_PARTS_Q8X8_NAME(int parts, const int *kinds, const uint8_t *const *ps, const int64_t *outs,
                            const float *x, int64_t n, int64_t inner, float *y, int64_t ldy, int threads) {
    enum { MAX_PARTS = 8 };
    q8x8_group_fn fns[MAX_PARTS];
    int64_t starts[MAX_PARTS + 1], cols[MAX_PARTS + 1];    /* groups, columns before each part */
    if (parts < 1 || parts > MAX_PARTS || inner % 32) return -1;
    starts[0] = cols[0] = 0;
    for (int i = 0; i < parts; i++) {
        fns[i] = q8x8_group_of(kinds[i]);
        if (!fns[i] || outs[i] % 8 || !tq_gemm_shape_ok(kinds[i], inner)) return -1;
        starts[i + 1] = starts[i] + outs[i] / 8;
        cols[i + 1] = cols[i] + outs[i];
    }
    const q8_rows xr = q8_quantize(x, n, inner, threads);
    if (!xr.mem) return -1;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t u = 0; u < starts[parts]; u++) {
        int i = 0;
        while (u >= starts[i + 1]) i++;
        const int64_t g = u - starts[i];
        fns[i](&xr, n, inner, ps[i] + g * (inner / 32 * tq_q8x8_chunk_bytes(kinds[i])), 0, y + cols[i] + 8 * g, ldy);
    }
    free(xr.mem);
    return 0;
}
