/* y = x W^T (+ bias) on GGUF blocks as stored, in plain C: the readable reference of every ISA's GEMM and the
   portable path (no intrinsics; gcc vectorises the lane loops for the baseline ISA, NEON on ARM).

   Each block of a weight row is rebuilt by tq_dequant_block (quants.h: gguf-py's arithmetic, bit for bit),
   then multiplied into 32 lane accumulators per row of x: lane l sums w[32 c + l] * x[32 c + l] over the
   row's 32-weight chunks c in order (a product, then a sum: -ffp-contract=off), and the 32 lanes are added
   pairwise (16 + 16, 8 + 8, ...). Lane-wise loops vectorise without reordering any sum, so the bits do not
   depend on the vector width the compiler picks.

   Exact rows: every row of x runs this same sequence whatever the row count or thread count, and y[r, o] is
   computed by one thread (OpenMP over o), so a row's output never depends on the block width.

   Also here, shared by every ISA: tq_dequantize_rows (embedding lookups, exact weights), the fp32-scale copy
   (tq_repack_scaled) and tq_abi. */
#include "quants.h"

#define ROWS 4   /* rows of x per pass over a weight row: its rebuilt block serves them all */

int tq_abi(void) { return 3; }

static inline float lanes_sum(float *a) {
    for (int s = 16; s > 0; s /= 2)
        for (int l = 0; l < s; l++) a[l] = a[l] + a[l + s];
    return a[0];
}

/* Rows r0..r0+N-1 of x against weight row o (N constant in each instance below). */
static inline __attribute__((always_inline)) void rows_times_row(int kind, int N, const float *x, int64_t inner,
                                                                 const uint8_t *row, const float *bias, float *y,
                                                                 int64_t ldy, int64_t r0, int64_t o) {
    const int bw = tq_block_weights(kind), bb = tq_block_bytes(kind);
    float acc[ROWS][32], wb[QK_K];
    for (int r = 0; r < N; r++)
        for (int l = 0; l < 32; l++) acc[r][l] = 0.0f;
    for (int64_t b = 0; b < inner / bw; b++) {
        tq_dequant_block(kind, row + b * bb, wb);
        for (int c = 0; c < bw / 32; c++)
            for (int r = 0; r < N; r++) {
                const float *xr = x + (r0 + r) * inner + b * bw + c * 32;
                for (int l = 0; l < 32; l++) acc[r][l] = acc[r][l] + wb[c * 32 + l] * xr[l];
            }
    }
    for (int r = 0; r < N; r++) y[(r0 + r) * ldy + o] = lanes_sum(acc[r]) + (bias ? bias[o] : 0.0f);
}

#define TQ_GEMM_NAME tq_gemm_generic
#define TQ_GEMM_PARTS_NAME tq_gemm_parts_generic
#include "gemm_dispatch.h"

/* Bytes of one row of ``inner`` weights of ``kind``'s scaled copy (tq_repack_scaled), or -1 for another kind. */
int64_t tq_scaled_row_bytes(int kind, int64_t inner) {
    if (kind < 0 || kind >= TQ_SCALED || tq_block_bytes(TQ_SCALED + kind) <= 0 || !tq_gemm_shape_ok(kind, inner))
        return -1;
    return inner / QK * tq_block_bytes(TQ_SCALED + kind);
}

/* The scaled copy of a legacy weight (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 -> TQ_SCALED + kind): every block with its
   fp16 scales widened to fp32 (exact), the rest of the block as it was. dst: ``out`` rows of inner / 32 blocks
   of tq_block_bytes(TQ_SCALED + kind) bytes, packed. Returns 0, or -1 for another kind or shape. */
int tq_repack_scaled(int kind, const uint8_t *w, int64_t ldw, int64_t out, int64_t inner, uint8_t *dst, int threads) {
    if (tq_scaled_row_bytes(kind, inner) < 0) return -1;
    const int skind = TQ_SCALED + kind, bb = tq_block_bytes(kind), sb = tq_block_bytes(skind);
    const int hs = tq_scale_bytes(kind), hd = tq_scale_bytes(skind), scales = tq_scales(kind);
    const int64_t nb = inner / QK;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t o = 0; o < out; o++)
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *from = w + o * ldw + b * bb;
            uint8_t *to = dst + (o * nb + b) * sb;
            for (int i = 0; i < scales; i++) {
                const float f = tq_scale(kind, from, i);
                memcpy(to + 4 * i, &f, 4);
            }
            memcpy(to + hd, from + hs, (size_t)(bb - hs));
        }
    return 0;
}

/* y [n, inner] = the exact weights of rows ids[0..n-1] (ids NULL: rows 0..n-1). Returns 0 or -1. */
int tq_dequantize_rows(int kind, const uint8_t *w, int64_t ldw, const int64_t *ids, int64_t n, int64_t inner,
                       float *y, int threads) {
    if (!tq_gemm_shape_ok(kind, inner)) return -1;
    const int bw = tq_block_weights(kind), bb = tq_block_bytes(kind);
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const uint8_t *row = w + (ids ? ids[i] : i) * ldw;
        for (int64_t b = 0; b < inner / bw; b++) tq_dequant_block(kind, row + b * bb, y + i * inner + b * bw);
    }
    return 0;
}
