/* head_bound.h in plain C: the reference, and the portable path's (ARM: gcc vectorises the block loops). */
#include "head_bound.h"

static void hb_row(int kind, const uint8_t *row, const hb_rows *p, int64_t n, float *A) {
    const int bb = tq_block_bytes(kind), sb = tq_scale_bytes(kind);
    for (int64_t r = 0; r < n; r++) A[r] = 0.0f;
    for (int64_t b = 0; b < p->nb; b++) {
        const uint8_t *blk = row + b * bb;
        const float d = tq_scale(kind, blk, 0);
        const int8_t *q = (const int8_t *)(blk + sb);
        for (int64_t r = 0; r < n; r++) {
            const int16_t *xq = p->xq + r * p->inner + b * QK;
            int32_t dot = 0;
            for (int j = 0; j < QK; j++) dot += (int32_t)q[j] * (int32_t)xq[j];
            A[r] += d * (float)dot;
        }
    }
}

static void hb_range(int kind, const uint8_t *w, int64_t ldw, int64_t o0, int64_t o1, const hb_rows *p, int64_t n,
                     const float *l1, hb_cands *c) {
    for (int64_t o = o0; o < o1; o++) {
        float A[HB_MAX_ROWS];
        hb_row(kind, w + o * ldw, p, n, A);
        for (int64_t r = 0; r < n; r++) hb_keep(p, (int)r, o, A[r], l1[o], c);
    }
}

int tq_head_bound_generic(int kind, const float *x, int64_t n, int64_t inner, const uint8_t *w, int64_t ldw,
                          int64_t out, const float *l1, int64_t cap, int32_t *cand_o, float *cand_u, int64_t *cand_n,
                          float *lower_max, int threads) {
    return hb_run(kind, x, n, inner, w, ldw, out, l1, cap, cand_o, cand_u, cand_n, lower_max, threads);
}
