/* head_bound.h in plain C: the reference, and the portable path's (ARM: gcc vectorises the block loops). */
#include "head_bound.h"

static void hb_row(int kind, const uint8_t *row, const hb_rows *p, int64_t n, float *A) {
    const int bb = tq_block_bytes(kind), bw = tq_block_weights(kind);
    for (int64_t r = 0; r < n; r++) A[r] = 0.0f;
    for (int64_t b = 0; b < p->inner / bw; b++) {
        const uint8_t *blk = row + b * bb;
        int8_t q[QK_K];                        /* the block's integers (Q6_K: q - 32) */
        float s[QK_K / 16];                    /* the scale of each run of ``run`` weights */
        int run;
        if (kind == TQ_Q6_K) {
            const float d = tq_half_to_float(tq_u16(blk + offsetof(block_q6_K, d)));
            const uint8_t *ql = blk + offsetof(block_q6_K, ql), *qh = blk + offsetof(block_q6_K, qh);
            const int8_t *sc = (const int8_t *)(blk + offsetof(block_q6_K, scales));
            for (int sub = 0; sub < QK_K / 16; sub++) {
                const int h = sub / 8, t = (sub / 2) % 4, l0 = 16 * (sub % 2);
                s[sub] = d * (float)sc[sub];
                for (int l = 0; l < 16; l++)
                    q[16 * sub + l] = (int8_t)((((ql[64 * h + 32 * (t % 2) + l0 + l] >> (4 * (t / 2))) & 0x0F)
                                                | (((qh[32 * h + l0 + l] >> (2 * t)) & 3) << 4)) - 32);
            }
            run = 16;
        } else {
            s[0] = tq_scale(kind, blk, 0);
            memcpy(q, blk + tq_scale_bytes(kind), QK);
            run = QK;
        }
        for (int64_t r = 0; r < n; r++) {
            const int16_t *xq = p->xq + r * p->inner + b * bw;
            for (int k = 0; k < bw / run; k++) {
                int32_t dot = 0;
                for (int j = 0; j < run; j++) dot += (int32_t)q[run * k + j] * (int32_t)xq[run * k + j];
                A[r] += s[k] * (float)dot;
            }
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
                       int64_t out, const float *l1, int64_t cap, int64_t *cand, int64_t *count, int threads) {
    return hb_run(kind, x, n, inner, w, ldw, out, l1, cap, cand, count, threads);
}
