/* The int8-activation GEMM (gemm_q8.h) with AVX2 integer multiply-adds; built for the avx2 path
   (gemm_q8_avx2.c) and, unchanged, for the avx512 path (gemm_q8_avx512.c). Reference: gemm_q8_generic.c.
   Kinds without the x8 layout (Q5_1) run here, and the others where a weight has no x8
   copy.

   A chunk's 32 integer weights sit in one register in weight order (nibbles: low ones are weights 0-15,
   high ones 16-31). Per row of x: vpmaddubsw multiplies unsigned weight bytes by the signed x bytes and adds
   pairs (int16, no saturation: at most 31 * 127 * 2, or 128 * 127 * 2 for signed weights, which go in as
   |w| against x carrying w's sign), vpmaddwd with ones adds pairs again: int32 lane l = weights 4l..4l+3,
   exact. Eight weight rows at a time: their eight lane vectors reduce (vphaddd) to one vector holding each
   row's sum per scale, so one conversion and one FMA carry 8 outputs per chunk: the arithmetic of gemm_q8.h,
   operation for operation. Up to ROWS rows of x share each chunk's weight registers. */
#include <immintrin.h>

#include "gemm_q8.h"
#include "gemm_shared_avx2.h"

#ifndef ROWS
#define ROWS 4
#endif
#define OUTS 8
#define Q8_PREFETCH_BYTES 384     /* how far ahead in each weight row the kernel below asks for its bytes */

static inline int q8_signed(int kind) { return kind == TQ_Q4_0 || kind == TQ_Q5_0 || kind == TQ_Q8_0 || kind == TQ_Q6_K; }

/* Chunk c of the block at blk: its 32 integer weights in weight order, scales s0 (weights 0-15) and s1
   (16-31), offset m (kinds with one). kind is a constant where this is inlined: the switch folds away. */
static inline __attribute__((always_inline)) __m256i q8_chunk(int kind, const uint8_t *blk, int c, float *s0, float *s1,
                                                              float *m) {
    switch (kind) {
    case TQ_Q4_0:
        *s0 = *s1 = half(blk);
        return _mm256_sub_epi8(nibble_bytes(blk + offsetof(block_q4_0, qs)), _mm256_set1_epi8(8));
    case TQ_Q4_1:
        *s0 = *s1 = half(blk);
        *m = half(blk + 2);
        return nibble_bytes(blk + offsetof(block_q4_1, qs));
    case TQ_Q5_0:
        *s0 = *s1 = half(blk);
        return _mm256_sub_epi8(_mm256_or_si256(nibble_bytes(blk + offsetof(block_q5_0, qs)),
                                               fifth_bit_bytes(tq_u32(blk + offsetof(block_q5_0, qh)))),
                               _mm256_set1_epi8(16));
    case TQ_Q5_1:
        *s0 = *s1 = half(blk);
        *m = half(blk + 2);
        return _mm256_or_si256(nibble_bytes(blk + offsetof(block_q5_1, qs)),
                               fifth_bit_bytes(tq_u32(blk + offsetof(block_q5_1, qh))));
    case TQ_Q8_0:
        *s0 = *s1 = half(blk);
        return _mm256_loadu_si256((const __m256i *)(blk + offsetof(block_q8_0, qs)));
    case TQ_Q4_K: case TQ_Q5_K: {
        uint8_t sc, mn;
        tq_scale_min_k4(c, blk + offsetof(block_q4_K, scales), &sc, &mn);
        *s0 = *s1 = half(blk) * (float)sc;                         /* d * sc, dmin * m: as tq_k4_decode */
        *m = -(half(blk + 2) * (float)mn);
        const uint8_t *qs = blk + (kind == TQ_Q5_K ? offsetof(block_q5_K, qs) : offsetof(block_q4_K, qs));
        const __m256i bytes = _mm256_loadu_si256((const __m256i *)(qs + 32 * (c / 2)));
        __m256i wv = _mm256_and_si256(c % 2 ? _mm256_srli_epi16(bytes, 4) : bytes, _mm256_set1_epi8(0x0F));
        if (kind == TQ_Q5_K) {
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + offsetof(block_q5_K, qh)));
            wv = _mm256_or_si256(wv, _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(c)),
                                                                         _mm256_set1_epi8(1)), 4));
        }
        return wv;
    }
    case TQ_Q6_K:
        *s0 = q6_k_scale(blk, 2 * c);
        *s1 = q6_k_scale(blk, 2 * c + 1);
        return q6_k_chunk(blk, c);
    default:
        *s0 = *s1 = 0.0f;
        return _mm256_setzero_si256();
    }
}

/* 8 vectors of int32 lanes (weight row i's products with an x block in p[i], lane l = weights 4l..4l+3) ->
   lo: lane i = row i's sum over weights 0-15, hi: over 16-31. Integer sums: exact in any order. */
static inline void q8_row_sums(const __m256i *p, __m256i *lo, __m256i *hi) {
    const __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
    const __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
    *lo = _mm256_permute2x128_si256(a, b, 0x20);
    *hi = _mm256_permute2x128_si256(a, b, 0x31);
}

/* Rows r0..r0+N-1 of x against weight rows o..o+m-1 (w: row o's first byte, ldw: bytes a row), 8 weight rows
   a pass: per chunk, each row's integer products reduce to one exact sum per scale, and one FMA carries the
   8 outputs' accumulators (gemm_q8.h's single accumulator a row, in chunk order). */
static inline __attribute__((always_inline)) void q8_rows_times_row(int kind, int N, const int8_t *xq, const float *xd,
                                                                    const float *xs, int64_t inner, const uint8_t *w,
                                                                    int64_t ldw, int m, const float *bias, float *y,
                                                                    int64_t ldy, int64_t r0, int64_t o) {
    __m256 acc[ROWS], msum[ROWS];
    for (int r = 0; r < N; r++) acc[r] = msum[r] = _mm256_setzero_ps();
    const int bb = tq_block_bytes(kind), per = tq_block_weights(kind) / 32, has_m = tq_q8_has_offset(kind);
    const int sgn = q8_signed(kind);
    const int64_t nb = inner / 32, blocks = inner / tq_block_weights(kind);
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t b = 0; b < blocks; b++) {
        for (int k = 0; k < per; k++) {
            const int64_t xb = b * per + k;                      /* the x block under chunk k of block b */
            __m256i wv[8], aw[8];
            float s0[8], s1[8], mo[8];
            /* 8 row streams at once: the hardware prefetcher keeps up with one, not with eight (Gemma 3's
               Q5_0 linears ran at half speed on Zen 3 without this) */
            const int64_t ahead = b * bb + (int64_t)k * bb / per + Q8_PREFETCH_BYTES;
            if (ahead < ldw)
                for (int i = 0; i < m; i++) _mm_prefetch((const char *)(w + i * ldw + ahead), _MM_HINT_T0);
            for (int i = 0; i < 8; i++) {
                s0[i] = s1[i] = mo[i] = 0.0f;
                wv[i] = i < m ? q8_chunk(kind, w + i * ldw + b * bb, k, &s0[i], &s1[i], &mo[i]) : _mm256_setzero_si256();
                aw[i] = sgn ? _mm256_sign_epi8(wv[i], wv[i]) : wv[i];
            }
            const __m256 S0 = _mm256_loadu_ps(s0), S1 = _mm256_loadu_ps(s1), MO = _mm256_loadu_ps(mo);
            for (int r = 0; r < N; r++) {
                const __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + (r0 + r) * inner + 32 * xb));
                __m256i pr[8], lo, hi;
                for (int i = 0; i < 8; i++)
                    pr[i] = _mm256_madd_epi16(_mm256_maddubs_epi16(aw[i], sgn ? _mm256_sign_epi8(xv, wv[i]) : xv), ones);
                q8_row_sums(pr, &lo, &hi);
                const __m256 dx = _mm256_set1_ps(xd[(r0 + r) * nb + xb]);
                if (kind == TQ_Q6_K) {
                    acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(S0, dx), _mm256_cvtepi32_ps(lo), acc[r]);
                    acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(S1, dx), _mm256_cvtepi32_ps(hi), acc[r]);
                } else {
                    acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(S0, dx), _mm256_cvtepi32_ps(_mm256_add_epi32(lo, hi)), acc[r]);
                }
                if (has_m) msum[r] = _mm256_fmadd_ps(MO, _mm256_set1_ps(xs[(r0 + r) * nb + xb]), msum[r]);
            }
        }
    }
    float bm[8] = {0.0f};
    for (int i = 0; i < m && bias; i++) bm[i] = bias[o + i];
    const __m256 b8 = _mm256_loadu_ps(bm);
    for (int r = 0; r < N; r++) {
        float out[8];
        _mm256_storeu_ps(out, _mm256_add_ps(_mm256_add_ps(acc[r], msum[r]), b8));
        for (int i = 0; i < m; i++) y[(r0 + r) * ldy + o + i] = out[i];
    }
}
