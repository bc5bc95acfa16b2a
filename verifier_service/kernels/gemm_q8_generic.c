/* The int8-activation GEMM (gemm_q8.h) in plain C: the readable reference of every ISA's q8 GEMM and the
   portable path. A weight chunk's integers, scales and offset come from tq_q8_chunk, written from the same
   block layouts as quants.h's dequantizers. */
#include "gemm_q8_chunk.h"

#define ROWS 4

static inline __attribute__((always_inline)) void q8_rows_times_row(int kind, int N, const int8_t *xq, const float *xd,
                                                                    const float *xs, int64_t inner, const uint8_t *row,
                                                                    const float *bias, float *y, int64_t ldy, int64_t r0,
                                                                    int64_t o) {
    const int bw = tq_block_weights(kind), bb = tq_block_bytes(kind);
    const int64_t nb = inner / 32;
    float acc[ROWS][8], msum[ROWS];
    for (int r = 0; r < N; r++) {
        msum[r] = 0.0f;
        for (int l = 0; l < 8; l++) acc[r][l] = 0.0f;
    }
    for (int64_t b = 0; b < inner / bw; b++)
        for (int c = 0; c < bw / 32; c++) {
            tq_q8_chunk_t ch;
            tq_q8_chunk(kind, row + b * bb, c, &ch);
            const int64_t xb = b * (bw / 32) + c;                       /* the x block under this chunk */
            for (int r = 0; r < N; r++) {
                const int8_t *q = xq + (r0 + r) * inner + 32 * xb;
                const float dx = xd[(r0 + r) * nb + xb];
                for (int l = 0; l < 8; l++) {
                    int32_t lane = 0;
                    for (int t = 0; t < 4; t++) lane += (int32_t)ch.w[4 * l + t] * (int32_t)q[4 * l + t];
                    acc[r][l] = fmaf(ch.scale[l / 4] * dx, (float)lane, acc[r][l]);
                }
                if (tq_q8_has_offset(kind)) msum[r] = fmaf(ch.offset, xs[(r0 + r) * nb + xb], msum[r]);
            }
        }
    for (int r = 0; r < N; r++) {
        const float *a = acc[r];
        const float s = ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
        y[(r0 + r) * ldy + o] = (s + msum[r]) + (bias ? bias[o] : 0.0f);
    }
}

#define TQ_GEMM_Q8_NAME tq_gemm_q8_generic
#define TQ_GEMM_PARTS_Q8_NAME tq_gemm_parts_q8_generic
#include "gemm_q8_dispatch.h"
