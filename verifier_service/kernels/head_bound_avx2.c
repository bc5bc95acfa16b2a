/* head_bound.h on AVX2 (the avx2 and avx512 paths). A block's 32 weights widened to int16 in two registers
   (vpmovsxbw from memory), vpmaddwd against x's 16-bit values gives the products in int32 pairs, exact (at most
   2 * 128 * 32767 a pair, 2^27 a block); the block's 8 lanes are converted and multiplied into fp32 lane
   accumulators by d; a row's lanes are added at its end. Q6_K: each 32-weight chunk as 32 bytes q - 32
   (q6_k_chunk), its two 16-weight halves each with its sub-block's d * sc. The row count is a constant in each instance (its
   accumulators stay in registers). Integer sums exact; the float ones' rounding is what head_bound.h bounds,
   whatever their order. */
#include <immintrin.h>

#include "gemm_shared_avx2.h"    /* q6_k_chunk, half */
#include "head_bound.h"
#include "simd_avx2.h"           /* v_hsum */

/* Independent accumulators a row keeps (by block, added at the end): an FMA's latency is several cycles, and one
   chain a row would leave a pass over one or two rows waiting on it. */
#define HB_ACCS(N) ((N) == 1 ? 4 : (N) == 2 ? 2 : 1)

/* One run's integer sums for rows 0..N-1 (16 int16 weights w against xq[at..at+15]) into lane accumulators
   a[r][k] by the run's scale. */
static inline __attribute__((always_inline)) void run16(int N, const hb_rows *p, int64_t at, __m256i w, __m256 s,
                                                        __m256 (*a)[4], int k) {
    for (int r = 0; r < N; r++) {
        const __m256i x = _mm256_loadu_si256((const __m256i *)(p->xq + r * p->inner + at));
        a[r][k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(w, x)), s, a[r][k]);
    }
}

/* One Q8_0 block (scales sb bytes, then 32 int8) as two runs of 16 into accumulator k. */
static inline __attribute__((always_inline)) void q8_block(int N, int kind, const uint8_t *blk, int sb,
                                                           const hb_rows *p, int64_t at, __m256 (*a)[4], int k) {
    const __m256 d = _mm256_set1_ps(tq_scale(kind, blk, 0));
    const __m256i q0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + sb)));
    const __m256i q1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + sb + 16)));
    for (int r = 0; r < N; r++) {
        const int16_t *xq = p->xq + r * p->inner + at;
        const __m256i s = _mm256_add_epi32(_mm256_madd_epi16(q0, _mm256_loadu_si256((const __m256i *)xq)),
                                           _mm256_madd_epi16(q1, _mm256_loadu_si256((const __m256i *)(xq + 16))));
        a[r][k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), d, a[r][k]);
    }
}

static inline __attribute__((always_inline)) void rows_n(int N, int kind, const uint8_t *row, const hb_rows *p,
                                                         float *A) {
    const int K = HB_ACCS(N);
    __m256 a[HB_MAX_ROWS][4];
    for (int r = 0; r < N; r++)
        for (int k = 0; k < K; k++) a[r][k] = _mm256_setzero_ps();
    if (kind == TQ_Q6_K) {                    /* 8 chunks a super-block, each two runs of 16 */
        const int64_t nsb = p->inner / QK_K;
        for (int64_t b = 0; b < nsb; b++) {
            const uint8_t *blk = row + b * (int64_t)sizeof(block_q6_K);
            float ds[QK_K / 16];              /* each sub-block's d * sc, as q6_k_scale (and quants.h) makes it */
            const float d = half(blk + offsetof(block_q6_K, d));
            const int8_t *sc = (const int8_t *)(blk + offsetof(block_q6_K, scales));
            for (int i = 0; i < QK_K / 16; i++) ds[i] = d * (float)sc[i];
            for (int c = 0; c < QK_K / 32; c += 2) {  /* chunk pairs: each run's accumulator a constant */
                const __m256i q0 = q6_k_chunk(blk, c), q1 = q6_k_chunk(blk, c + 1);
                const int64_t at = b * QK_K + 32 * c;
                run16(N, p, at, _mm256_cvtepi8_epi16(_mm256_castsi256_si128(q0)),
                      _mm256_set1_ps(ds[2 * c]), a, 0);
                run16(N, p, at + 16, _mm256_cvtepi8_epi16(_mm256_extracti128_si256(q0, 1)),
                      _mm256_set1_ps(ds[2 * c + 1]), a, 1 % K);
                run16(N, p, at + 32, _mm256_cvtepi8_epi16(_mm256_castsi256_si128(q1)),
                      _mm256_set1_ps(ds[2 * c + 2]), a, 2 % K);
                run16(N, p, at + 48, _mm256_cvtepi8_epi16(_mm256_extracti128_si256(q1, 1)),
                      _mm256_set1_ps(ds[2 * c + 3]), a, 3 % K);
            }
        }
    } else {                                  /* Q8_0 (either layout): one block a run of 32 */
        const int bb = tq_block_bytes(kind), sb = tq_scale_bytes(kind);
        int64_t b = 0;
        for (; b + K <= p->nb; b += K)        /* block b + k into accumulator k (a constant: registers) */
            for (int k = 0; k < K; k++) q8_block(N, kind, row + (b + k) * bb, sb, p, (b + k) * QK, a, k);
        for (; b < p->nb; b++) q8_block(N, kind, row + b * bb, sb, p, b * QK, a, 0);
    }
    for (int r = 0; r < N; r++) {
        __m256 t = a[r][0];
        for (int k = 1; k < K; k++) t = _mm256_add_ps(t, a[r][k]);
        A[r] = v_hsum(t);
    }
}

static inline __attribute__((always_inline)) void range_n(int N, int kind, const uint8_t *w, int64_t ldw, int64_t o0,
                                                          int64_t o1, const hb_rows *p, const float *l1, hb_cands *c) {
    for (int64_t o = o0; o < o1; o++) {
        float A[HB_MAX_ROWS];
        rows_n(N, kind, w + o * ldw, p, A);
        for (int r = 0; r < N; r++) hb_keep(p, r, o, A[r], l1[o], c);
    }
}

static void hb_range(int kind, const uint8_t *w, int64_t ldw, int64_t o0, int64_t o1, const hb_rows *p, int64_t n,
                     const float *l1, hb_cands *c) {
    switch (n) {
    case 1: range_n(1, kind, w, ldw, o0, o1, p, l1, c); break;
    case 2: range_n(2, kind, w, ldw, o0, o1, p, l1, c); break;
    case 3: range_n(3, kind, w, ldw, o0, o1, p, l1, c); break;
    case 4: range_n(4, kind, w, ldw, o0, o1, p, l1, c); break;
    case 5: range_n(5, kind, w, ldw, o0, o1, p, l1, c); break;
    case 6: range_n(6, kind, w, ldw, o0, o1, p, l1, c); break;
    case 7: range_n(7, kind, w, ldw, o0, o1, p, l1, c); break;
    default: range_n(8, kind, w, ldw, o0, o1, p, l1, c); break;
    }
}

int tq_head_bound_avx2(int kind, const float *x, int64_t n, int64_t inner, const uint8_t *w, int64_t ldw,
                       int64_t out, const float *l1, int64_t cap, int64_t *cand, int64_t *count, int threads) {
    return hb_run(kind, x, n, inner, w, ldw, out, l1, cap, cand, count, threads);
}
