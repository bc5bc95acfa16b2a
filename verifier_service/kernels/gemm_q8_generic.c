/* The int8-activation GEMM (gemm_q8.h) in plain C: the readable reference of every ISA's q8 GEMM and the
   portable path. A weight chunk's integers, scales and offset come from tq_q8_chunk, written from the same
   block layouts as quants.h's dequantizers. */
#include "gemm_q8_chunk.h"

#define ROWS 4
#define OUTS 1

static inline __attribute__((always_inline)) void q8_rows_times_row(int kind, int N, const int8_t *xq, const float *xd,
                                                                    const float *xs, int64_t inner, const uint8_t *row,
                                                                    int64_t ldw, int m, const float *bias, float *y,
                                                                    int64_t ldy, int64_t r0, int64_t o) {
    (void)ldw, (void)m;                                                 /* one weight row a call */
    const int bw = tq_block_weights(kind), bb = tq_block_bytes(kind), halves = kind == TQ_Q6_K ? 2 : 1;
    const int64_t nb = inner / 32;
    float acc[ROWS], msum[ROWS];
    for (int r = 0; r < N; r++) acc[r] = msum[r] = 0.0f;
    for (int64_t b = 0; b < inner / bw; b++)
        for (int c = 0; c < bw / 32; c++) {
            tq_q8_chunk_t ch;
            tq_q8_chunk(kind, row + b * bb, c, &ch);
            const int64_t xb = b * (bw / 32) + c;                       /* the x block under this chunk */
            for (int r = 0; r < N; r++) {
                const int8_t *q = xq + (r0 + r) * inner + 32 * xb;
                const float dx = xd[(r0 + r) * nb + xb];
                for (int h = 0; h < halves; h++) {                      /* one product per scale */
                    int32_t L = 0;
                    for (int j = 32 / halves * h; j < 32 / halves * (h + 1); j++) L += (int32_t)ch.w[j] * (int32_t)q[j];
                    acc[r] = fmaf(ch.scale[h] * dx, (float)L, acc[r]);
                }
                if (tq_q8_has_offset(kind)) msum[r] = fmaf(ch.offset, xs[(r0 + r) * nb + xb], msum[r]);
            }
        }
    for (int r = 0; r < N; r++) y[(r0 + r) * ldy + o] = (acc[r] + msum[r]) + (bias ? bias[o] : 0.0f);
}

#define TQ_GEMM_Q8_NAME tq_gemm_q8_generic
#define TQ_GEMM_PARTS_Q8_NAME tq_gemm_parts_q8_generic
#include "gemm_q8_dispatch.h"

/* Bytes of the x8 layout of a weight [out, inner] of kind (0: none). */
int64_t tq_q8x8_bytes(int kind, int64_t out, int64_t inner) {
    return tq_q8x8_kind_ok(kind) && out % 8 == 0 && tq_gemm_shape_ok(kind, inner) && inner % 32 == 0
               ? out / 8 * (inner / 32) * tq_q8x8_chunk_bytes(kind) : 0;
}

/* Where qs starts in a Q4_0/Q4_1/Q5_0/Q8_0 block of the file. */
static int legacy_qs_offset(int kind) {
    return kind == TQ_Q4_1 ? (int)offsetof(block_q4_1, qs) : kind == TQ_Q5_0 ? (int)offsetof(block_q5_0, qs) : 2;
}

/* Row c's K-quant block blk into the x8 super-block at s8 (gemm_q8.h's Q4_K/Q5_K and Q6_K layouts). */
static void pack_super_block_row(int kind, const uint8_t *blk, uint8_t *s8, int c) {
    if (kind == TQ_Q6_K) {
        memcpy(s8 + 2 * c, blk + offsetof(block_q6_K, d), 2);
        for (int i = 0; i < 16; i++) s8[TQ_Q6X8_SC + 8 * i + c] = blk[offsetof(block_q6_K, scales) + i];
        for (int p = 0; p < 4; p++)
            for (int l = 0; l < 8; l++)
                memcpy(s8 + TQ_Q6X8_QL + 32 * (8 * p + l) + 4 * c, blk + offsetof(block_q6_K, ql) + 32 * p + 4 * l, 4);
        for (int h = 0; h < 2; h++)
            for (int l = 0; l < 8; l++)
                memcpy(s8 + TQ_Q6X8_QH + 32 * (8 * h + l) + 4 * c, blk + offsetof(block_q6_K, qh) + 32 * h + 4 * l, 4);
        return;
    }
    const size_t qs = kind == TQ_Q5_K ? offsetof(block_q5_K, qs) : offsetof(block_q4_K, qs);
    memcpy(s8 + 2 * c, blk, 2);
    memcpy(s8 + 16 + 2 * c, blk + 2, 2);
    for (int k = 0; k < 8; k++)
        tq_scale_min_k4(k, blk + offsetof(block_q4_K, scales), s8 + TQ_K4X8_SC + 8 * k + c, s8 + TQ_K4X8_M + 8 * k + c);
    if (kind == TQ_Q5_K)
        for (int l = 0; l < 8; l++) memcpy(s8 + TQ_K5X8_QH + 32 * l + 4 * c, blk + offsetof(block_q5_K, qh) + 4 * l, 4);
    for (int p = 0; p < 4; p++)
        for (int l = 0; l < 8; l++)
            memcpy(s8 + tq_k4x8_qs_offset(kind) + 32 * (8 * p + l) + 4 * c, blk + qs + 32 * p + 4 * l, 4);
}

/* Weight [out, inner] of kind (rows at w + o * ldw) -> the x8 layout at dst/* Weight [out, inner] of kind (rows at w + o * ldw) -> the x8 layout at dst (gemm_q8.h; out / 8 groups of
   inner / 32 chunks). Returns 0, or -1 for a kind without that layout or out not a multiple of 8. */
int tq_pack_q8x8(int kind, const uint8_t *w, int64_t ldw, int64_t out, int64_t inner, uint8_t *dst, int threads) {
    if (!tq_q8x8_kind_ok(kind) || out % 8 || inner % 32 || !tq_gemm_shape_ok(kind, inner)) return -1;
    const int64_t nb = inner / 32, cb = tq_q8x8_chunk_bytes(kind), bb = tq_block_bytes(kind);
    /* qs_at: qs in a file block; x8_qs: in an x8 chunk */
    const int qs_at = legacy_qs_offset(kind), lanes = tq_q8x8_lanes(kind), x8_qs = tq_q8x8_qs_offset(kind);
    if (tq_block_weights(kind) == QK_K) {                             /* Q4_K, Q5_K, Q6_K: per super-block */
#pragma omp parallel for num_threads(threads) schedule(static)
        for (int64_t g = 0; g < out / 8; g++)
            for (int64_t b = 0; b < inner / QK_K; b++)
                for (int c = 0; c < 8; c++)                      /* super-block b of group g, row c's block */
                    pack_super_block_row(kind, w + (8 * g + c) * ldw + b * bb, dst + (g * nb + 8 * b) * cb, c);
        return 0;
    }
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t g = 0; g < out / 8; g++)
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *c8 = dst + (g * nb + b) * cb;
            for (int c = 0; c < 8; c++) {
                const uint8_t *blk = w + (8 * g + c) * ldw + b * bb;
                memcpy(c8 + 2 * c, blk, 2);                                       /* d */
                if (kind == TQ_Q4_1) memcpy(c8 + 16 + 2 * c, blk + 2, 2);       /* m */
                if (kind == TQ_Q5_0) memcpy(c8 + 16 + 4 * c, blk + 2, 4);       /* qh */
                for (int l = 0; l < lanes; l++) memcpy(c8 + x8_qs + 32 * l + 4 * c, blk + qs_at + 4 * l, 4);
            }
        }
    return 0;
}

/* y [n, inner] = the exact weights of rows ids[0..n-1] (ids NULL: rows 0..n-1) read from the x8 layout at p
   (each block put back together, then quants.h's dequantizer): the x8 copy serves embedding lookups and wide
   prefill chunks without the file's pages. Returns 0 or -1. */
int tq_dequantize_rows_q8x8(int kind, const uint8_t *p, int64_t inner, const int64_t *ids, int64_t n, float *y,
                            int threads) {
    if (!tq_q8x8_kind_ok(kind) || inner % 32 || !tq_gemm_shape_ok(kind, inner)) return -1;
    const int64_t nb = inner / 32, cb = tq_q8x8_chunk_bytes(kind);
    /* qs_at: qs in a file block; x8_qs: in an x8 chunk */
    const int qs_at = legacy_qs_offset(kind), lanes = tq_q8x8_lanes(kind), x8_qs = tq_q8x8_qs_offset(kind);
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const int64_t o = ids ? ids[i] : i, g = o / 8;
        const int c = (int)(o % 8);
        if (kind == TQ_Q6_K) {                 /* the file's block put back together, then quants.h's dequantizer */
            block_q6_K blk;
            for (int64_t b = 0; b < inner / QK_K; b++) {
                const uint8_t *s8 = p + (g * nb + 8 * b) * cb;
                memcpy(&blk.d, s8 + 2 * c, 2);
                for (int k = 0; k < 16; k++) blk.scales[k] = (int8_t)s8[TQ_Q6X8_SC + 8 * k + c];
                for (int q = 0; q < 4; q++)
                    for (int l = 0; l < 8; l++) memcpy(blk.ql + 32 * q + 4 * l, s8 + TQ_Q6X8_QL + 32 * (8 * q + l) + 4 * c, 4);
                for (int h = 0; h < 2; h++)
                    for (int l = 0; l < 8; l++) memcpy(blk.qh + 32 * h + 4 * l, s8 + TQ_Q6X8_QH + 32 * (8 * h + l) + 4 * c, 4);
                tq_dequant_block(kind, (const uint8_t *)&blk, y + i * inner + QK_K * b);
            }
            continue;
        }
        if (kind == TQ_Q4_K || kind == TQ_Q5_K) {   /* quants.h's formula, from the unpacked scales and mins */
            const int five = kind == TQ_Q5_K, x8_qs = tq_k4x8_qs_offset(kind);
            for (int64_t b = 0; b < inner / QK_K; b++) {
                const uint8_t *s8 = p + (g * nb + 8 * b) * cb;
                const float d = tq_half_to_float(tq_u16(s8 + 2 * c)), dmin = tq_half_to_float(tq_u16(s8 + 16 + 2 * c));
                float *yb = y + i * inner + QK_K * b;
                for (int k = 0; k < 8; k++) {
                    const float dsc = d * (float)s8[TQ_K4X8_SC + 8 * k + c], dm = dmin * (float)s8[TQ_K4X8_M + 8 * k + c];
                    for (int l = 0; l < 8; l++)
                        for (int j = 0; j < 4; j++) {
                            const uint8_t byte = s8[x8_qs + 32 * (8 * (k / 2) + l) + 4 * c + j];
                            const int hi = five ? ((s8[TQ_K5X8_QH + 32 * l + 4 * c + j] >> k) & 1) << 4 : 0;
                            yb[32 * k + 4 * l + j] = dsc * (float)(((byte >> (4 * (k % 2))) & 0x0F) | hi) - dm;
                        }
                }
            }
            continue;
        }
        uint8_t blk[sizeof(block_q8_0)];
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *c8 = p + (g * nb + b) * cb;
            memcpy(blk, c8 + 2 * c, 2);
            if (kind == TQ_Q4_1) memcpy(blk + 2, c8 + 16 + 2 * c, 2);
            if (kind == TQ_Q5_0) memcpy(blk + 2, c8 + 16 + 4 * c, 4);
            for (int l = 0; l < lanes; l++) memcpy(blk + qs_at + 4 * l, c8 + x8_qs + 32 * l + 4 * c, 4);
            tq_dequant_block(kind, blk, y + i * inner + 32 * b);
        }
    }
    return 0;
}

