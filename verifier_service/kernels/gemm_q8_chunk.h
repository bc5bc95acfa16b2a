/* One 32-weight chunk of a quantized block as the q8 GEMM reads it (gemm_q8.h): integers w[0..31] in weight
   order, scale[0] for weights 0-15 and scale[1] for 16-31, and offset, so that weight j = scale * w[j] +
   offset exactly as quants.h rebuilds it (the products are exact: an 11-bit scale times at most 8 bits). */
#pragma once
#include "gemm_q8.h"

typedef struct { int8_t w[32]; float scale[2], offset; } tq_q8_chunk_t;

/* Chunk c (0 for legacy blocks; 0..7 of a K-quant super-block) of the block at blk. */
static inline void tq_q8_chunk(int kind, const uint8_t *blk, int c, tq_q8_chunk_t *ch) {
    ch->offset = 0.0f;
    switch (kind) {
    case TQ_Q4_0: case TQ_Q4_1: case TQ_Q5_0: case TQ_Q5_1: {
        const int has_min = kind == TQ_Q4_1 || kind == TQ_Q5_1, five = kind == TQ_Q5_0 || kind == TQ_Q5_1;
        const size_t qs_at = kind == TQ_Q4_0 ? offsetof(block_q4_0, qs) : kind == TQ_Q4_1 ? offsetof(block_q4_1, qs)
                           : kind == TQ_Q5_0 ? offsetof(block_q5_0, qs) : offsetof(block_q5_1, qs);
        const uint32_t qh = five ? tq_u32(blk + (kind == TQ_Q5_0 ? offsetof(block_q5_0, qh) : offsetof(block_q5_1, qh))) : 0;
        const int bias = has_min ? 0 : five ? 16 : 8;
        for (int j = 0; j < 16; j++) {
            const uint8_t byte = blk[qs_at + j];
            ch->w[j] = (int8_t)(((byte & 0x0F) | (int)(((qh >> j) & 1) << 4)) - bias);
            ch->w[j + 16] = (int8_t)(((byte >> 4) | (int)(((qh >> (j + 16)) & 1) << 4)) - bias);
        }
        ch->scale[0] = ch->scale[1] = tq_half_to_float(tq_u16(blk));
        if (has_min) ch->offset = tq_half_to_float(tq_u16(blk + 2));
        break;
    }
    case TQ_Q8_0:
        memcpy(ch->w, blk + offsetof(block_q8_0, qs), 32);
        ch->scale[0] = ch->scale[1] = tq_half_to_float(tq_u16(blk));
        break;
    case TQ_Q4_K: case TQ_Q5_K: {
        tq_k4_block k;
        tq_k4_decode(kind, blk, &k);
        const uint8_t *q = k.qs + (c / 2) * 32;
        for (int l = 0; l < 32; l++) {
            int v = (q[l] >> (4 * (c % 2))) & 0x0F;
            if (kind == TQ_Q5_K) v |= ((k.qh[l] >> c) & 1) << 4;
            ch->w[l] = (int8_t)v;
        }
        ch->scale[0] = ch->scale[1] = k.dsc[c];
        ch->offset = -k.dm[c];
        break;
    }
    case TQ_Q6_K: {
        const float d = tq_half_to_float(tq_u16(blk + offsetof(block_q6_K, d)));
        const uint8_t *ql = blk + offsetof(block_q6_K, ql), *qh = blk + offsetof(block_q6_K, qh);
        const int8_t *scales = (const int8_t *)(blk + offsetof(block_q6_K, scales));
        const int h = c / 4, t = c % 4;                  /* weights 32 c + l = 128 h + 32 t + l */
        for (int l = 0; l < 32; l++) {
            const int v = ((ql[64 * h + 32 * (t % 2) + l] >> (4 * (t / 2))) & 0x0F) | (((qh[32 * h + l] >> (2 * t)) & 3) << 4);
            ch->w[l] = (int8_t)(v - 32);
        }
        ch->scale[0] = d * (float)scales[2 * c];
        ch->scale[1] = d * (float)scales[2 * c + 1];
        break;
    }
    default:
        memset(ch, 0, sizeof *ch);
        break;
    }
}
