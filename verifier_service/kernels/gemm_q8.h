/* The int8-activation GEMM ("q8" arithmetic): y = x W^T where each row of x is first rounded to int8 in
   blocks of 32 values, and each 32-weight chunk of a quantized weight row is multiplied by the block of x
   under it in integers. This is how llama.cpp computes every quantized matmul (its q8_0/q8_1 activations):
   an int8 multiply-add does 32 weights in one instruction where the fp32 path rebuilds and converts them
   first (all linears of the default target, Zen 3: 1.17-1.28x faster; BENCHMARKS.md). The results differ from
   the fp32 path (and from transformers' fp32 forward of the same file) by the activation rounding (each value
   of x moves by up to half a step of d_b below);
   the verifier uses one arithmetic for plain steps and verify blocks alike, so speculative output stays the
   target's own token for token.

   The arithmetic, exactly (gemm_q8_generic.c is this text in C; every ISA computes the same bits):
     x block b of a row (values x_j, j = 0..31):  amax = max |x_j|;  d_b = amax / 127;  id = d_b ? 1 / d_b : 0;
       q_j = round-to-nearest-even(x_j * id) (int8);  s_b = d_b * (float) sum_j q_j.
     weight chunk (32 weights of one block, natural order): integers w_j, a scale for weights 0-15 and one
       for 16-31 (equal except Q6_K, whose sub-blocks are 16 weights) and an offset m (0 where the kind has
       none), so that weight j = scale * w_j + m as quants.h rebuilds it:
       Q4_0 d, q - 8 | Q4_1 d, q, m | Q5_0 d, q - 16 | Q5_1 d, q, m | Q8_0 d, q |
       Q4_K/Q5_K d * sc, q, -(dmin * m) | Q6_K d * sc (per 16), q - 32.
     one fp32 acc and one fp32 msum, both 0; for each chunk in order, with x block b under it:
       per scale of the chunk (one for weights 0-31; Q6_K: one for weights 0-15, then one for 16-31):
         L = sum of w_j q_j over the weights of that scale (exact int32);  acc = fma(scale * d_b, (float) L, acc)
       msum = fma(m, s_b, msum)            (kinds with an offset only)
     y = (acc + msum) (+ bias).
   Every integer is exact and every fp32 operation is one IEEE rounding in a fixed order, so a row's result
   does not depend on the ISA, the block width or the thread count (exact rows). One product per chunk (a
   row's 32 integer products summed before any rounding, as llama.cpp sums a block) is what lets the x8
   kernel below keep one accumulator a row and so run several rows of x through each weight load.

   F32/F16/BF16 weights have no int8 form here: they stay on the fp32 GEMM (callers choose per weight).

   Each gemm_q8_<isa>.c defines ROWS, q8_rows_times_row(kind, N, ...) (rows r0..r0+N-1 of the quantized x
   against weight row o), TQ_GEMM_Q8_NAME and TQ_GEMM_PARTS_Q8_NAME, then includes gemm_q8_dispatch.h. */
#pragma once
#include <math.h>
#include <stdlib.h>

#include "quants.h"

/* Kinds whose weights carry an offset (m above): the others add no msum term at all. */
static inline int tq_q8_has_offset(int kind) {
    return kind == TQ_Q4_1 || kind == TQ_Q5_1 || kind == TQ_Q4_K || kind == TQ_Q5_K;
}

/* Row r of x rounded as above: q [inner] int8, d, s, t and h [inner / 32] (t: the integer sum of each block's q,
   h: of its first 16; the x8 kernels read Q4_0/Q5_0 (t) and Q6_K (h, t - h) weights unsigned with them). Plain C
   on every ISA (each a single IEEE operation or an exact one, so vectorised or not the bits are these); h is
   summed after the rounding loop: inside it, the loop stopped vectorising (x8 GEMMs 5-9 % slower at w8). */
static inline void tq_q8_quantize_row(const float *x, int64_t inner, int8_t *q, float *d, float *s, int32_t *t,
                                      int32_t *h) {
    for (int64_t b = 0; b < inner / 32; b++) {
        const float *xb = x + 32 * b;
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) {
            const float a = fabsf(xb[j]);
            amax = a > amax ? a : amax;
        }
        const float db = amax / 127.0f;
        const float id = db != 0.0f ? 1.0f / db : 0.0f;
        int sum = 0;
        for (int j = 0; j < 32; j++) {
            const float v = nearbyintf(xb[j] * id);           /* |v| <= 127 */
            const int iv = v == v ? (int)v : 0;               /* NaN (a NaN or inf input): 0 */
            q[32 * b + j] = (int8_t)iv;
            sum += iv;
        }
        int lower = 0;
        for (int j = 0; j < 16; j++) lower += q[32 * b + j];
        h[b] = lower;
        d[b] = db;
        s[b] = db * (float)sum;
        t[b] = sum;
    }
}

/* ---- 8 weight rows interleaved (the "x8" layout) ---------------------------------------------------------
   Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K and Q6_K weights may also be read from a copy in which 8 weight rows are interleaved, so that
   one 32-byte load holds 4 consecutive weights of each of 8 rows and one vector of accumulators holds
   8 outputs: the same integer sums, the same FMAs and the same additions per output as above
   (bit-identical results), with the weight decoding and the scale conversions shared by 8 rows. Group g
   (weight rows 8g..8g+7) is nb = inner / 32 chunks of tq_q8x8_chunk_bytes(kind) bytes, chunk b:
     d[8] (fp16, row c's block b scale), then for Q4_1 m[8] (fp16), for Q5_0 qh[8] (row c's 32 fifth bits), then
     Q4_0/Q4_1/Q5_0: qs[4][32]: qs[l][4c + j] = row c's qs[4l + j]  (low nibbles: weights 4l + j, high: 16 + 4l + j)
     Q8_0:      qs[8][32]: qs[l][4c + j] = row c's qs[4l + j]
   Q4_K is laid out per 256-weight super-block (8 chunks, 8 x 148 bytes): d[8], dmin[8] (fp16), sc[8 chunks][8
   rows] and m[8][8] (the 6-bit scales and mins, unpacked to bytes), then qs[4 pairs][8 lanes][32]:
   qs[p][l][4c + j] = row c's qs[32p + 4l + j] (low nibbles: chunk 2p's weights 4l + j, high: chunk 2p + 1's).
   Q5_K is Q4_K's layout with the fifth bits before qs (8 x 180 bytes): d[8], dmin[8], sc[8][8], m[8][8], then
   qh[8 lanes][32]: qh[l][4c + j] = row c's qh[4l + j] (bit k: chunk k's weight 4l + j), then qs as Q4_K's.
   Q6_K is laid out per super-block too (8 x 210 bytes): d[8] (fp16), sc[16 sub-blocks][8 rows] (int8), then
   ql[4][8 lanes][32]: ql[p][l][4c + j] = row c's ql[32p + 4l + j] (chunk 4h + t reads pair 2h + t % 2, low
   nibbles for t < 2), then qh[2][8 lanes][32]: qh[h][l][4c + j] = row c's qh[32h + 4l + j] (bits 2t, 2t + 1).
   The same bytes as the file's blocks, reordered (Q4_K: its scales unpacked, 32 bytes more a group). */
static inline int tq_q8x8_kind_ok(int kind) {
    return kind == TQ_Q4_0 || kind == TQ_Q4_1 || kind == TQ_Q5_0 || kind == TQ_Q8_0 || kind == TQ_Q4_K
        || kind == TQ_Q5_K || kind == TQ_Q6_K;
}

static inline int64_t tq_q8x8_chunk_bytes(int kind) {
    return kind == TQ_Q4_0 ? 144 : kind == TQ_Q4_1 ? 160 : kind == TQ_Q5_0 ? 176 : kind == TQ_Q8_0 ? 272
         : kind == TQ_Q4_K ? 148
         : kind == TQ_Q5_K ? 180 : kind == TQ_Q6_K ? 210 : 0;
}

/* Q4_K/Q5_K x8 super-block: where sc, m, (Q5_K) qh and qs start; Q6_K's: where sc, ql and qh start. */
enum { TQ_K4X8_SC = 32, TQ_K4X8_M = 96, TQ_K5X8_QH = 160, TQ_Q6X8_SC = 16, TQ_Q6X8_QL = 144, TQ_Q6X8_QH = 144 + 1024 };
static inline int tq_k4x8_qs_offset(int kind) { return kind == TQ_Q5_K ? TQ_K5X8_QH + 256 : TQ_K5X8_QH; }

/* Q4_0/Q4_1/Q5_0/Q8_0 x8 chunks: where qs starts (after d[8], and m[8] for Q4_1, qh[8] for Q5_0), and its
   32-byte lane rows. */
static inline int tq_q8x8_qs_offset(int kind) { return kind == TQ_Q4_1 ? 32 : kind == TQ_Q5_0 ? 48 : 16; }
static inline int tq_q8x8_lanes(int kind) { return kind == TQ_Q8_0 ? 8 : 4; }

