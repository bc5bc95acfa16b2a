/* y = x W^T (+ bias) on GGUF blocks as stored, AVX-512 (F/BW/VL, FMA, F16C). Reference: gemm_generic.c.

   Each 32-weight chunk of a weight row is rebuilt in two registers (elements 0-15, 16-31) with exactly the
   arithmetic of quants.h (gguf-py's), then multiplied into two fp32 accumulators per row of x with FMAs.
   4-bit kinds look their weights up in a table of the 16 (or, with a fifth bit, 32) values the block can
   hold, computed with the block's own formula (vpermps reads the low 4 bits of each index, vpermt2ps 5);
   the others convert their integers and scale them. Lane l of the two accumulators sums chunk elements
   l and l + 16 in chunk order; the row's result is reduce_add(lo + hi).

   Up to 8 rows of x share each rebuilt chunk; the row count is a constant in each instance (its 16
   accumulators stay in registers and the row loop unrolls: with a run-time count, branches between the
   FMAs and zeroing all 8 rows cost 10-25 % at widths 1-8). Exact rows: every row runs the same sequence
   whatever the row or thread count; y[r, o] is computed by one thread.

   Long rows (gemm_dispatch.h: TWO_COLUMNS) from two rows of x up: two columns a pass over up to 4 rows
   (rows_times_two_rows), each chunk of x loaded once for both, where 8 rows of x would no longer fit L1.
   Each (row, column) chain is the one-column pass's, FMA for FMA. The K-quants, whose chunks cost more to
   rebuild, take two columns from 8 rows of x over rows of 2 048 weights or more, in two passes of half of
   every chunk each (rows_times_two_rows_halves): 8 rows of x then fit L1 again. */
#include <immintrin.h>

#include "gemm_shared_avx2.h"
#include "quants.h"

#ifndef ROWS
#define ROWS 8   /* a build may ask for fewer instances (2, 3, 4): the emulated test build does */
#endif
#define PAIR_ROWS (ROWS < 4 ? ROWS : 4)  /* rows of x in a two-column pass (16 accumulators) */

static inline __m128i load16(const uint8_t *p) { return _mm_loadu_si128((const __m128i *)p); }

/* A legacy block's scale i broadcast (gemm_shared_avx2.h: scale_value): in the scaled layout one broadcast load,
   which takes no shuffle unit (on Zen 4, where a 512-bit shuffle takes them twice, the fp32
   forward is bound by them: BENCHMARKS.md, twenty-sixth session). */
static inline __m512 scale(int kind, const uint8_t *p, int i) { return _mm512_set1_ps(scale_value(kind, p, i)); }

/* Scales 0 and 1 (Q4_1/Q5_1: d and m) broadcast. The file's fp16 pair: one 32-bit broadcast load, one
   conversion (lanes alternate d, m), two in-lane shuffles; the scaled layout: two broadcast loads. */
static inline void scale_pair(int kind, const uint8_t *p, __m512 *vd, __m512 *vm) {
    if (tq_is_scaled(kind)) {
        *vd = scale(kind, p, 0);
        *vm = scale(kind, p, 1);
        return;
    }
    const __m512 dm = _mm512_cvtph_ps(_mm256_set1_epi32((int)tq_u32(p)));
    *vd = _mm512_shuffle_ps(dm, dm, 0x00);
    *vm = _mm512_shuffle_ps(dm, dm, 0x55);
}

#define IOTA _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
#define IOTA16 _mm512_setr_ps(16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31)

/* The chunk's weights (wl: elements 0-15, wh: 16-31) times rows r0.. of x at column xo, into lo/hi. */
#define FMA_ROWS(wl, wh, xo)                                                                             \
    for (int r = 0; r < N; r++) {                                                                        \
        const float *xr = x + (r0 + r) * inner + (xo);                                                   \
        lo[r] = _mm512_fmadd_ps((wl), _mm512_loadu_ps(xr), lo[r]);                                      \
        hi[r] = _mm512_fmadd_ps((wh), _mm512_loadu_ps(xr + 16), hi[r]);                                 \
    }

/* 16 bytes widened to int32 lanes once: as indices their low nibbles (vpermps reads an index's low 4 bits),
   shifted right by 4 their high nibbles. One widening for both halves of a block: on Zen 4 a 512-bit widening
   takes the shuffle units twice, and the fp32 forward is bound by them there (BENCHMARKS.md, twenty-fifth
   session). */
static inline __m512i byte_lanes(__m128i q) { return _mm512_cvtepu8_epi32(q); }
static inline __m512i high_nibbles(__m512i bytes) { return _mm512_srli_epi32(bytes, 4); }

static inline __m512 q8_times(const int8_t *q, __m512 vd) {
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q))), vd);
}

/* Chunk j (32 weights) of the block at blk rebuilt into wl (elements 0-15) and wh (16-31). Q4_K/Q5_K read
   their scales from k4 (decoded once a block by the caller); the legacy kinds have one chunk a block. */
static inline __attribute__((always_inline)) void chunk_weights(int kind, const uint8_t *blk, int j,
                                                                const tq_k4_block *k4, __m512 *wl, __m512 *wh) {
    const __m512i nib = _mm512_set1_epi32(0x0F), five = _mm512_set1_epi32(16);
    switch (kind) {
    case TQ_F32: {
        const float *p = (const float *)blk;
        *wl = _mm512_loadu_ps(p);
        *wh = _mm512_loadu_ps(p + 16);
        break;
    }
    case TQ_F16:
        *wl = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk));
        *wh = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 32)));
        break;
    case TQ_BF16:
        *wl = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)blk)), 16));
        *wh = _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(blk + 32))), 16));
        break;
    case TQ_Q4_0: case TQ_Q4_0S: {                    /* table[q] = d * (q - 8) */
        const __m512 table = _mm512_mul_ps(scale(kind, blk, 0), _mm512_sub_ps(IOTA, _mm512_set1_ps(8)));
        const __m512i q = byte_lanes(load16(blk + tq_scale_bytes(kind)));
        *wl = _mm512_permutexvar_ps(q, table);
        *wh = _mm512_permutexvar_ps(high_nibbles(q), table);
        break;
    }
    case TQ_Q4_1: case TQ_Q4_1S: {                    /* table[q] = (d * q) + m */
        __m512 vd, vm;
        scale_pair(kind, blk, &vd, &vm);
        const __m512 table = _mm512_add_ps(_mm512_mul_ps(vd, IOTA), vm);
        const __m512i q = byte_lanes(load16(blk + tq_scale_bytes(kind)));
        *wl = _mm512_permutexvar_ps(q, table);
        *wh = _mm512_permutexvar_ps(high_nibbles(q), table);
        break;
    }
    case TQ_Q5_0: case TQ_Q5_0S:
    case TQ_Q5_1: case TQ_Q5_1S: {                    /* 32-entry tables: q = nibble | qh bit << 4 */
        const int one = kind == TQ_Q5_1 || kind == TQ_Q5_1S;
        __m512 vd, vm, t0, t1;
        scale_pair(kind, blk, &vd, &vm);              /* Q5_0: vm is the first bytes of qh, unused */
        if (one) {                                    /* (d * q) + m */
            t0 = _mm512_add_ps(_mm512_mul_ps(vd, IOTA), vm);
            t1 = _mm512_add_ps(_mm512_mul_ps(vd, IOTA16), vm);
        } else {                                      /* d * (q - 16) */
            t0 = _mm512_mul_ps(vd, _mm512_sub_ps(IOTA, _mm512_set1_ps(16)));
            t1 = _mm512_mul_ps(vd, IOTA);
        }
        const uint8_t *p = blk + tq_scale_bytes(kind);
        const uint32_t qh = tq_u32(p);
        const __m512i q = byte_lanes(load16(p + 4));
        __m512i il = _mm512_and_si512(q, nib), ih = high_nibbles(q);
        il = _mm512_mask_or_epi32(il, (__mmask16)(qh & 0xFFFF), il, five);
        ih = _mm512_mask_or_epi32(ih, (__mmask16)(qh >> 16), ih, five);
        *wl = _mm512_permutex2var_ps(t0, il, t1);
        *wh = _mm512_permutex2var_ps(t0, ih, t1);
        break;
    }
    case TQ_Q8_0: case TQ_Q8_0S: {                    /* q * d */
        const __m512 vd = scale(kind, blk, 0);
        const int8_t *q = (const int8_t *)(blk + tq_scale_bytes(kind));
        *wl = q8_times(q, vd);
        *wh = q8_times(q + 16, vd);
        break;
    }
    case TQ_Q4_K:
    case TQ_Q5_K: {                                   /* sub-block j: (d * sc) * q - dmin * m */
        const __m512 vdsc = _mm512_set1_ps(k4->dsc[j]), vdm = _mm512_set1_ps(k4->dm[j]);
        const __m512 t0 = _mm512_sub_ps(_mm512_mul_ps(vdsc, IOTA), vdm);
        const uint8_t *q = k4->qs + (j / 2) * 32;
        const int shift = (j % 2) * 4;
        __m512i il = _mm512_srli_epi32(_mm512_cvtepu8_epi32(load16(q)), shift);
        __m512i ih = _mm512_srli_epi32(_mm512_cvtepu8_epi32(load16(q + 16)), shift);
        if (kind == TQ_Q5_K) {
            const __m512 t1 = _mm512_sub_ps(_mm512_mul_ps(vdsc, IOTA16), vdm);
            const __m128i bit = _mm_set1_epi8((char)(1 << j));
            il = _mm512_mask_or_epi32(_mm512_and_si512(il, nib), _mm_test_epi8_mask(load16(k4->qh), bit),
                                      _mm512_and_si512(il, nib), five);
            ih = _mm512_mask_or_epi32(_mm512_and_si512(ih, nib), _mm_test_epi8_mask(load16(k4->qh + 16), bit),
                                      _mm512_and_si512(ih, nib), five);
            *wl = _mm512_permutex2var_ps(t0, il, t1);
            *wh = _mm512_permutex2var_ps(t0, ih, t1);
        } else {
            *wl = _mm512_permutexvar_ps(il, t0);
            *wh = _mm512_permutexvar_ps(ih, t0);
        }
        break;
    }
    case TQ_Q6_K: {                                   /* (d * sc) * q, 16-weight sub-blocks */
        const __m256i q = q6_k_chunk(blk, j);
        *wl = _mm512_mul_ps(_mm512_set1_ps(q6_k_scale(blk, 2 * j)),
                            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(q))));
        *wh = _mm512_mul_ps(_mm512_set1_ps(q6_k_scale(blk, 2 * j + 1)),
                            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(q, 1))));
        break;
    }
    default:
        *wl = *wh = _mm512_setzero_ps();
        break;
    }
}

static inline int chunks_per_block(int kind) {
    return kind == TQ_Q4_K || kind == TQ_Q5_K || kind == TQ_Q6_K ? QK_K / 32 : 1;
}

static inline int k4_kind(int kind) { return kind == TQ_Q4_K || kind == TQ_Q5_K; }

static inline __attribute__((always_inline)) void rows_times_row(int kind, int N, const float *x, int64_t inner,
                                                                 const uint8_t *row, const float *bias, float *y,
                                                                 int64_t ldy, int64_t r0, int64_t o) {
    __m512 lo[ROWS], hi[ROWS];
    for (int r = 0; r < N; r++) { lo[r] = _mm512_setzero_ps(); hi[r] = _mm512_setzero_ps(); }
    const int bb = tq_block_bytes(kind), bw = tq_block_weights(kind), cpb = chunks_per_block(kind);
    const int64_t nb = inner / bw;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = row + b * bb;
        tq_k4_block k4;
        if (k4_kind(kind)) tq_k4_decode(kind, blk, &k4);
        for (int j = 0; j < cpb; j++) {
            __m512 wl, wh;
            chunk_weights(kind, blk, j, &k4, &wl, &wh);
            FMA_ROWS(wl, wh, b * bw + j * 32);
        }
    }
    for (int r = 0; r < N; r++)
        y[(r0 + r) * ldy + o] = _mm512_reduce_add_ps(_mm512_add_ps(lo[r], hi[r])) + (bias ? bias[o] : 0.0f);
}

/* Columns o and o + 1 (weight rows row and row + ldw) for rows r0.. of x (N <= PAIR_ROWS): each chunk of x
   loaded once for both columns. Every (row, column) chain is rows_times_row's, FMA for FMA: the same bits. */
static inline __attribute__((always_inline)) void rows_times_two_rows(int kind, int N, const float *x,
                                                                      int64_t inner, const uint8_t *row,
                                                                      int64_t ldw, const float *bias, float *y,
                                                                      int64_t ldy, int64_t r0, int64_t o) {
    __m512 lo0[PAIR_ROWS], hi0[PAIR_ROWS], lo1[PAIR_ROWS], hi1[PAIR_ROWS];
    for (int r = 0; r < N; r++) lo0[r] = hi0[r] = lo1[r] = hi1[r] = _mm512_setzero_ps();
    const int bb = tq_block_bytes(kind), bw = tq_block_weights(kind), cpb = chunks_per_block(kind);
    const int64_t nb = inner / bw;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk0 = row + b * bb, *blk1 = row + ldw + b * bb;
        tq_k4_block k40, k41;
        if (k4_kind(kind)) {
            tq_k4_decode(kind, blk0, &k40);
            tq_k4_decode(kind, blk1, &k41);
        }
        for (int j = 0; j < cpb; j++) {
            __m512 wl0, wh0, wl1, wh1;
            chunk_weights(kind, blk0, j, &k40, &wl0, &wh0);
            chunk_weights(kind, blk1, j, &k41, &wl1, &wh1);
            for (int r = 0; r < N; r++) {
                const float *xr = x + (r0 + r) * inner + b * bw + j * 32;
                const __m512 xl = _mm512_loadu_ps(xr), xh = _mm512_loadu_ps(xr + 16);
                lo0[r] = _mm512_fmadd_ps(wl0, xl, lo0[r]);
                hi0[r] = _mm512_fmadd_ps(wh0, xh, hi0[r]);
                lo1[r] = _mm512_fmadd_ps(wl1, xl, lo1[r]);
                hi1[r] = _mm512_fmadd_ps(wh1, xh, hi1[r]);
            }
        }
    }
    for (int r = 0; r < N; r++) {
        y[(r0 + r) * ldy + o] = _mm512_reduce_add_ps(_mm512_add_ps(lo0[r], hi0[r])) + (bias ? bias[o] : 0.0f);
        y[(r0 + r) * ldy + o + 1] = _mm512_reduce_add_ps(_mm512_add_ps(lo1[r], hi1[r])) + (bias ? bias[o + 1] : 0.0f);
    }
}
#define TWO_COLUMNS 1

/* One half of every chunk (h = 0: elements 0-15, h = 1: 16-31) of columns o and o + 1 (weight rows row and
   row + ldw) times rows r0.. of x (N <= ROWS), into acc[column][row]: exactly rows_times_row's lo (h = 0) or hi
   (h = 1) chains, FMA for FMA. A pass reads half of each chunk of x, so 8 rows of a long row stay in L1, and
   each half chunk of x loaded serves both columns. */
static inline __attribute__((always_inline)) void half_pass(int kind, int N, int h, const float *x, int64_t inner,
                                                            const uint8_t *row, int64_t ldw, int64_t r0,
                                                            __m512 acc[2][ROWS]) {
    for (int r = 0; r < N; r++) acc[0][r] = acc[1][r] = _mm512_setzero_ps();
    const int bb = tq_block_bytes(kind), bw = tq_block_weights(kind), cpb = chunks_per_block(kind);
    const int64_t nb = inner / bw;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk0 = row + b * bb, *blk1 = row + ldw + b * bb;
        tq_k4_block k40, k41;
        if (k4_kind(kind)) {
            tq_k4_decode(kind, blk0, &k40);
            tq_k4_decode(kind, blk1, &k41);
        }
        for (int j = 0; j < cpb; j++) {
            __m512 wl0, wh0, wl1, wh1;
            chunk_weights(kind, blk0, j, &k40, &wl0, &wh0);   /* the half not used is dead code */
            chunk_weights(kind, blk1, j, &k41, &wl1, &wh1);
            const __m512 w0 = h ? wh0 : wl0, w1 = h ? wh1 : wl1;
            const float *xc = x + r0 * inner + b * bw + j * 32 + 16 * h;
            for (int r = 0; r < N; r++) {
                const __m512 xv = _mm512_loadu_ps(xc + r * inner);
                acc[0][r] = _mm512_fmadd_ps(w0, xv, acc[0][r]);
                acc[1][r] = _mm512_fmadd_ps(w1, xv, acc[1][r]);
            }
        }
    }
}

/* Columns o and o + 1 for rows r0.. of x (N <= ROWS) in two half passes (half_pass): each (row, column)'s lo
   and hi chains are rows_times_row's, and so is their sum: the same bits. */
static inline __attribute__((always_inline)) void rows_times_two_rows_halves(int kind, int N, const float *x,
                                                                             int64_t inner, const uint8_t *row,
                                                                             int64_t ldw, const float *bias,
                                                                             float *y, int64_t ldy, int64_t r0,
                                                                             int64_t o) {
    __m512 lo[2][ROWS], hi[2][ROWS];
    half_pass(kind, N, 0, x, inner, row, ldw, r0, lo);
    half_pass(kind, N, 1, x, inner, row, ldw, r0, hi);
    for (int r = 0; r < N; r++) {
        y[(r0 + r) * ldy + o] = _mm512_reduce_add_ps(_mm512_add_ps(lo[0][r], hi[0][r])) + (bias ? bias[o] : 0.0f);
        y[(r0 + r) * ldy + o + 1] = _mm512_reduce_add_ps(_mm512_add_ps(lo[1][r], hi[1][r])) + (bias ? bias[o + 1] : 0.0f);
    }
}
#define HALF_COLUMNS 1

#define TQ_GEMM_NAME tq_gemm_avx512
#define TQ_GEMM_PARTS_NAME tq_gemm_parts_avx512
#include "gemm_dispatch.h"
