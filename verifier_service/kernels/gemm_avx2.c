/* y = x W^T (+ bias) on GGUF blocks as stored, AVX2 + FMA + F16C. Reference: gemm_generic.c.

   Each 32-weight chunk of a weight row is rebuilt as four 8-wide registers (elements 0-7, 8-15, 16-23,
   24-31) with exactly the arithmetic of quants.h (gguf-py's): integers widened to int32, converted, then
   scaled and offset as the block's formula says. Where the formula is a product then a sum, (d * q) + m or
   (d * sc) * q - dmin * m, one FMA computes it with the same result: the product is exact in fp32 (d has
   11 significant bits, sc 6, q at most 5, so at most 22 bits), so rounding it first changes nothing. Each is multiplied into its own accumulator per row of x
   with an FMA, so lane l of accumulator k sums chunk element 8k + l in chunk order; the row's result is
   the sum of the four accumulators ((a0 + a1) + (a2 + a3)) reduced 8 -> 4 -> 2 -> 1.

   Up to ROWS rows of x share each rebuilt chunk; the row count is a constant in each instance. With 4 rows
   some of the 16 accumulators spill to L1, which still beat 2 or 3 rows a pass at widths 4-8 (fewer
   rebuilds) and matched them at widths 1-3 (default target's linears, 1 thread). Exact rows: every row runs the same
   sequence whatever the row or thread count; y[r, o] is computed by one thread. */
#include <immintrin.h>

#include "gemm_shared_avx2.h"
#include "quants.h"

#ifndef ROWS
#define ROWS 4
#endif

/* 8 bytes -> 8 int32 lanes (zero- or sign-extended) */
static inline __m256i u8x8(const uint8_t *p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)); }
static inline __m256i i8x8(const void *p) { return _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)); }
static inline __m256 f32(__m256i v) { return _mm256_cvtepi32_ps(v); }

/* w[0..3] (the chunk's four registers) times rows r0.. of x at column xo, into acc. */
#define FMA_ROWS(w, xo)                                                                                  \
    for (int r = 0; r < N; r++) {                                                                        \
        const float *xr = x + (r0 + r) * inner + (xo);                                                   \
        for (int k = 0; k < 4; k++) acc[r][k] = _mm256_fmadd_ps((w)[k], _mm256_loadu_ps(xr + 8 * k), acc[r][k]); \
    }

/* A legacy block's scale i broadcast (gemm_shared_avx2.h: scale_value). */
static inline __m256 scale(int kind, const uint8_t *p, int i) { return _mm256_set1_ps(scale_value(kind, p, i)); }

/* The 4-bit values of elements 8k..8k+7 of a legacy block (qs: its 16 nibble bytes). */
static inline __m256i nibbles(const uint8_t *qs, int k) {
    const __m256i v = u8x8(qs + 8 * (k % 2));
    return k < 2 ? _mm256_and_si256(v, _mm256_set1_epi32(0x0F)) : _mm256_srli_epi32(v, 4);
}

/* Elements 8k..8k+7 of 32 signed / unsigned bytes as int32 lanes. */
#define BYTES_TO_LANES(cvt, v, out)                                                                      \
    do {                                                                                                 \
        const __m128i lo_ = _mm256_castsi256_si128(v), hi_ = _mm256_extracti128_si256(v, 1);             \
        (out)[0] = cvt(lo_); (out)[1] = cvt(_mm_srli_si128(lo_, 8));                                     \
        (out)[2] = cvt(hi_); (out)[3] = cvt(_mm_srli_si128(hi_, 8));                                     \
    } while (0)

static inline __attribute__((always_inline)) void rows_times_row(int kind, int N, const float *x, int64_t inner,
                                                                 const uint8_t *row, const float *bias, float *y,
                                                                 int64_t ldy, int64_t r0, int64_t o) {
    __m256 acc[ROWS][4];
    for (int r = 0; r < N; r++)
        for (int k = 0; k < 4; k++) acc[r][k] = _mm256_setzero_ps();
    const __m256i nib = _mm256_set1_epi32(0x0F);
    const int bb = tq_block_bytes(kind);
    const int64_t nb = inner / tq_block_weights(kind);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = row + b * bb;
        __m256 w[4];
        switch (kind) {
        case TQ_F32:
            for (int k = 0; k < 4; k++) w[k] = _mm256_loadu_ps((const float *)blk + 8 * k);
            FMA_ROWS(w, b * 32);
            break;
        case TQ_F16:
            for (int k = 0; k < 4; k++) w[k] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 16 * k)));
            FMA_ROWS(w, b * 32);
            break;
        case TQ_BF16:
            for (int k = 0; k < 4; k++)
                w[k] = _mm256_castsi256_ps(_mm256_slli_epi32(
                    _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(blk + 16 * k))), 16));
            FMA_ROWS(w, b * 32);
            break;
        case TQ_Q4_0: case TQ_Q4_0S: {                    /* d * (q - 8) */
            const __m256 vd = scale(kind, blk, 0);
            const uint8_t *qs = blk + tq_scale_bytes(kind);
            for (int k = 0; k < 4; k++)
                w[k] = _mm256_mul_ps(vd, f32(_mm256_sub_epi32(nibbles(qs, k), _mm256_set1_epi32(8))));
            FMA_ROWS(w, b * 32);
            break;
        }
        case TQ_Q4_1: case TQ_Q4_1S: {                    /* (d * q) + m */
            const __m256 vd = scale(kind, blk, 0), vm = scale(kind, blk, 1);
            const uint8_t *qs = blk + tq_scale_bytes(kind);
            for (int k = 0; k < 4; k++) w[k] = _mm256_fmadd_ps(vd, f32(nibbles(qs, k)), vm);   /* d * q exact */
            FMA_ROWS(w, b * 32);
            break;
        }
        case TQ_Q5_0: case TQ_Q5_0S: {                    /* d * (q - 16) */
            const __m256 vd = scale(kind, blk, 0);
            const uint8_t *rest = blk + tq_scale_bytes(kind);               /* qh[4], then qs */
            const __m256i q5 = _mm256_or_si256(nibble_bytes(rest + 4), fifth_bit_bytes(tq_u32(rest)));
            __m256i q[4];
            BYTES_TO_LANES(_mm256_cvtepi8_epi32, _mm256_sub_epi8(q5, _mm256_set1_epi8(16)), q);
            for (int k = 0; k < 4; k++) w[k] = _mm256_mul_ps(vd, f32(q[k]));
            FMA_ROWS(w, b * 32);
            break;
        }
        case TQ_Q5_1: case TQ_Q5_1S: {                    /* (d * q) + m */
            const __m256 vd = scale(kind, blk, 0), vm = scale(kind, blk, 1);
            const uint8_t *rest = blk + tq_scale_bytes(kind);               /* qh[4], then qs */
            __m256i q[4];
            BYTES_TO_LANES(_mm256_cvtepu8_epi32, _mm256_or_si256(nibble_bytes(rest + 4), fifth_bit_bytes(tq_u32(rest))), q);
            for (int k = 0; k < 4; k++) w[k] = _mm256_fmadd_ps(vd, f32(q[k]), vm);
            FMA_ROWS(w, b * 32);
            break;
        }
        case TQ_Q8_0: case TQ_Q8_0S: {                    /* q * d */
            const __m256 vd = scale(kind, blk, 0);
            const uint8_t *qs = blk + tq_scale_bytes(kind);
            for (int k = 0; k < 4; k++) w[k] = _mm256_mul_ps(f32(i8x8(qs + 8 * k)), vd);
            FMA_ROWS(w, b * 32);
            break;
        }
        case TQ_Q4_K: {                                   /* sub-block j: (d * sc) * q - dmin * m */
            tq_k4_block k4;
            tq_k4_decode(kind, blk, &k4);
            for (int g = 0; g < 4; g++) {                 /* sub-blocks 2g, 2g + 1: low, high nibbles of 32 bytes */
                const __m256 d0 = _mm256_set1_ps(k4.dsc[2 * g]), m0 = _mm256_set1_ps(k4.dm[2 * g]);
                const __m256 d1 = _mm256_set1_ps(k4.dsc[2 * g + 1]), m1 = _mm256_set1_ps(k4.dm[2 * g + 1]);
                __m256i bytes[4];
                for (int k = 0; k < 4; k++) bytes[k] = u8x8(k4.qs + 32 * g + 8 * k);
                for (int k = 0; k < 4; k++) w[k] = _mm256_fmsub_ps(d0, f32(_mm256_and_si256(bytes[k], nib)), m0);
                FMA_ROWS(w, b * QK_K + 64 * g);
                for (int k = 0; k < 4; k++) w[k] = _mm256_fmsub_ps(d1, f32(_mm256_srli_epi32(bytes[k], 4)), m1);
                FMA_ROWS(w, b * QK_K + 64 * g + 32);
            }
            break;
        }
        case TQ_Q5_K: {                                   /* sub-block j: (d * sc) * q - dmin * m, fifth bit qh */
            tq_k4_block k4;
            tq_k4_decode(kind, blk, &k4);
            for (int j = 0; j < 8; j++) {
                const __m256 vdsc = _mm256_set1_ps(k4.dsc[j]), vdm = _mm256_set1_ps(k4.dm[j]);
                const uint8_t *q = k4.qs + (j / 2) * 32;
                for (int k = 0; k < 4; k++) {
                    __m256i v = _mm256_and_si256(_mm256_srli_epi32(u8x8(q + 8 * k), 4 * (j % 2)), nib);
                    v = _mm256_or_si256(v, _mm256_slli_epi32(
                        _mm256_and_si256(_mm256_srli_epi32(u8x8(k4.qh + 8 * k), j), _mm256_set1_epi32(1)), 4));
                    w[k] = _mm256_fmsub_ps(vdsc, f32(v), vdm);          /* (d * sc) * q exact */
                }
                FMA_ROWS(w, b * QK_K + j * 32);
            }
            break;
        }
        case TQ_Q6_K: {                                   /* (d * sc) * q, 16-weight sub-blocks */
            for (int s = 0; s < 8; s++) {
                const __m256i q = q6_k_chunk(blk, s);
                const __m128i q0 = _mm256_castsi256_si128(q), q1 = _mm256_extracti128_si256(q, 1);
                const __m256 d0 = _mm256_set1_ps(q6_k_scale(blk, 2 * s)), d1 = _mm256_set1_ps(q6_k_scale(blk, 2 * s + 1));
                w[0] = _mm256_mul_ps(d0, f32(_mm256_cvtepi8_epi32(q0)));
                w[1] = _mm256_mul_ps(d0, f32(_mm256_cvtepi8_epi32(_mm_srli_si128(q0, 8))));
                w[2] = _mm256_mul_ps(d1, f32(_mm256_cvtepi8_epi32(q1)));
                w[3] = _mm256_mul_ps(d1, f32(_mm256_cvtepi8_epi32(_mm_srli_si128(q1, 8))));
                FMA_ROWS(w, b * QK_K + s * 32);
            }
            break;
        }
        default: break;
        }
    }
    for (int r = 0; r < N; r++) {
        const __m256 s8 = _mm256_add_ps(_mm256_add_ps(acc[r][0], acc[r][1]), _mm256_add_ps(acc[r][2], acc[r][3]));
        __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
        s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
        const float s = _mm_cvtss_f32(_mm_add_ss(s4, _mm_movehdup_ps(s4)));
        y[(r0 + r) * ldy + o] = s + (bias ? bias[o] : 0.0f);
    }
}

#define TQ_GEMM_NAME tq_gemm_avx2
#define TQ_GEMM_PARTS_NAME tq_gemm_parts_avx2
#include "gemm_dispatch.h"
