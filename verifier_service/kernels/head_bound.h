/* The head's logits to within a proven bound, cheaply: the candidates for a row's argmax (verifier_service/
   greedy_head.py). Shared by head_bound_generic.c and head_bound_avx2.c, which define the loop hb_range (a
   thread's weight rows against the prepared rows of x) and name the entry point.

   For a Q8_0 head (w = d * q: an 11-bit by 8-bit product, exact) or a Q6_K one (w = (d * sc) * (q - 32),
   rounded once) and a row x of fp32 activations, x is rounded to 16 bits (dx = m / 32767, m = max_j |x_j|;
   xq = round(x / dx)) and, with integer dot products over each run of weights that shares a scale s_ob
   (Q8_0: d of a 32-weight block; Q6_K: d * sc of a 16-weight sub-block),

     A_o = dx * sum_b s_ob * sum_j q_obj xq_bj          (each run's sum exact in int32: at most 2^27)
     T_o = C * L1_o,   C = e + 2 (inner + 64) 2^-24 (m + e),   L1_o = sum_j |w_oj| (``l1``, rounded up)

   with e = max_j |x_j - dx xq_j| (computed in double: exact). For the fp32 logit y_o the exact kernels compute
   (FMAs over the rebuilt weights in any order), |y_o - A_o| <= T_o:
     |y_o - sum_j w_j x_j|          <= gamma_inner sum_j |w_j| |x_j|             <= (inner + 1) 2^-24 m L1_o
     |sum_j w_j (x_j - dx xq_j)|    <= e L1_o
     |A_o computed - A_o real|      <= (nb + 8) 2^-24 dx sum_b s_ob |sum_j q xq| <= (nb + 8) 2^-24 (m + e) L1_o
     (the float conversion of a run's sum, its product and sum, the final product: nb + 8 roundings at most,
     nb <= inner / 16 runs; for Q6_K, L1_o of the weights as rebuilt, each within 2^-24 of the real product:
     one more 2^-24 (m + e) L1_o), all within the 2 (inner + 64) 2^-24 (m + e) L1_o of C.
   The rounding of T_o itself and of A_o +- T_o is covered by widening: T'_o = T_o (1 + 2^-10) + |A_o| 2^-20.

   With L = max_o (A_o - T'_o), every o whose U_o = A_o + T'_o is below L has y_o below the row's
   largest logit, so the argmax (and every tie for it) is among {o : U_o >= L}. Each thread keeps, per row of x,
   the o whose U_o reaches the largest A - T' it has seen so far (its own running L, never above the final
   one): a superset of those, a few dozen rows; at the end the ones with U_o >= L are written, ascending, to
   cand [row][cap] with their count in count [row]. Which rows those are may differ by ISA or thread count;
   the argmax found from them with the exact kernel's logits does not.

   Returns 0; -1 for a kind other than Q8_0 / Q8_0S / Q6_K or a shape it does not take; -2 where x holds a value that
   is not finite, -3 where a thread's list for a row outgrew ``cap`` (the caller then computes every logit). */
#pragma once
#include <math.h>
#include <stdlib.h>

#include "attention_rows.h"        /* tq_thread, tq_threads: OpenMP's, or one thread in a build without it */
#include "quants.h"

#define HB_MAX_ROWS 8                      /* rows of x a call takes */

typedef struct {
    int16_t *xq;                           /* [n][inner]: x rounded to 16 bits */
    float dx[HB_MAX_ROWS], c[HB_MAX_ROWS];  /* each row's step and C */
    int64_t nb, inner;
} hb_rows;

/* Rounds each row of x to 16 bits and its bound's C. 0, or -2 (a value not finite). */
static int hb_prepare(const float *x, int64_t n, int64_t inner, hb_rows *p) {
    const double kappa = 2.0 * (double)(inner + 64) * 0x1p-24;
    p->nb = inner / QK;
    p->inner = inner;
    for (int64_t r = 0; r < n; r++) {
        const float *xr = x + r * inner;
        float m = 0.0f;
        for (int64_t j = 0; j < inner; j++) {
            if (!isfinite(xr[j])) return -2;
            const float a = fabsf(xr[j]);
            m = a > m ? a : m;
        }
        const float d = m / 32767.0f;
        const float inv = d > 0.0f ? 1.0f / d : 0.0f;
        double e = 0.0;
        int16_t *q = p->xq + r * inner;
        for (int64_t j = 0; j < inner; j++) {
            long v = lrintf(xr[j] * inv);
            v = v > 32767 ? 32767 : v < -32767 ? -32767 : v;
            q[j] = (int16_t)v;
            const double err = fabs((double)xr[j] - (double)d * (double)v);
            e = err > e ? err : e;
        }
        p->dx[r] = d;
        p->c[r] = nextafterf((float)(e + kappa * ((double)m + e)), INFINITY);     /* rounded up */
    }
    return 0;
}

/* A thread's candidates for each row of x (see above). */
typedef struct {
    int32_t *o;                            /* [rows][cap] */
    float *u;                              /* [rows][cap] */
    int64_t *count;                        /* [rows] */
    int64_t cap;
    float low[HB_MAX_ROWS];                /* the running L, per row */
    int overflow;
} hb_cands;

/* Each ISA's loop over weight rows o0..o1-1 (kind's layout, ``ldw`` bytes apart) for rows 0..n-1 of p, each
   logit through hb_keep. */
static void hb_range(int kind, const uint8_t *w, int64_t ldw, int64_t o0, int64_t o1, const hb_rows *p, int64_t n,
                     const float *l1, hb_cands *c);

/* Logit o of row r from its A (before the factor dx): the running L raised, (o, U) kept where U reaches it. */
static inline __attribute__((always_inline)) void hb_keep(const hb_rows *p, int r, int64_t o, float A, float l1,
                                                          hb_cands *c) {
    const float a = A * p->dx[r];
    const float t = (p->c[r] * l1) * (1.0f + 0x1p-10f) + fabsf(a) * 0x1p-20f;
    const float up = a + t, lo = a - t;
    if (lo > c->low[r]) c->low[r] = lo;
    if (up >= c->low[r]) {
        const int64_t k = c->count[r];
        if (k < c->cap) {
            c->o[r * c->cap + k] = (int32_t)o;
            c->u[r * c->cap + k] = up;
            c->count[r] = k + 1;
        } else {
            c->overflow = 1;
        }
    }
}

static int hb_run(int kind, const float *x, int64_t n, int64_t inner, const uint8_t *w, int64_t ldw, int64_t out,
                  const float *l1, int64_t cap, int64_t *cand, int64_t *count, int threads) {
    if ((kind != TQ_Q8_0 && kind != TQ_Q8_0S && kind != TQ_Q6_K) || n < 1 || n > HB_MAX_ROWS
        || inner % tq_block_weights(kind) || out < 1 || cap < 1 || out > INT32_MAX) return -1;
    if (threads < 1) threads = 1;
    if (threads > 64) threads = 64;
    hb_rows p;
    p.xq = malloc(sizeof(int16_t) * (size_t)(n * inner));
    int32_t *cand_o = malloc(sizeof(int32_t) * (size_t)(threads * n * cap));   /* each thread's lists */
    float *cand_u = malloc(sizeof(float) * (size_t)(threads * n * cap));
    int64_t *cand_n = calloc((size_t)(threads * n), sizeof(int64_t));
    int rc = p.xq && cand_o && cand_u && cand_n ? hb_prepare(x, n, inner, &p) : -1;
    if (rc == 0) {
        float lows[64][HB_MAX_ROWS];
        int over = 0, used = 0;
#pragma omp parallel num_threads(threads) reduction(|:over)
        {
            const int t = tq_thread(), nt = tq_threads();
#pragma omp single
            used = nt;
            const int64_t per = (out + nt - 1) / nt, o0 = t * per, o1 = o0 + per < out ? o0 + per : out;
            hb_cands c = {cand_o + t * n * cap, cand_u + t * n * cap, cand_n + t * n, cap, {0}, 0};
            for (int64_t r = 0; r < n; r++) {
                c.count[r] = 0;
                c.low[r] = -INFINITY;
            }
            if (o0 < o1) hb_range(kind, w, ldw, o0, o1, &p, n, l1, &c);
            for (int64_t r = 0; r < n; r++) lows[t][r] = c.low[r];
            over |= c.overflow;
        }
        for (int64_t r = 0; r < n && !over; r++) {     /* L, then the lists' entries that reach it, in order */
            float m = -INFINITY;
            for (int t = 0; t < used; t++) m = lows[t][r] > m ? lows[t][r] : m;
            int64_t k = 0;
            for (int t = 0; t < used; t++)
                for (int64_t i = 0; i < cand_n[t * n + r]; i++) {
                    const int64_t at = (t * n + r) * cap + i;
                    if (cand_u[at] < m) continue;
                    if (k == cap) { over = 1; break; }
                    cand[r * cap + k++] = cand_o[at];
                }
            count[r] = k;
        }
        if (over) rc = -3;
    }
    free(p.xq); free(cand_o); free(cand_u); free(cand_n);
    return rc;
}
