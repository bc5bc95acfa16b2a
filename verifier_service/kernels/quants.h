/* GGUF block layouts and their exact dequantization: the scalar reference every kernel rebuilds weights by.

   A weight matrix [out, inner] is stored row by row; a row is inner / QK(kind) blocks, each a struct below
   exactly as ggml writes it (little-endian, packed, fp16 scales as raw IEEE half bits). Kinds carry ggml's
   type numbers (gguf.GGMLQuantizationType), so Python passes the file's type as is.

   The formulas mirror gguf-py's numpy dequantizers (gguf/quants.py), which give the fp32 weights
   transformers loads: every product and sum below is one fp32 operation rounded as numpy rounds it, in the
   same order (sources are built with -ffp-contract=off, so no multiply-add is fused). In the K-quants the
   sub-block scales d * sc and dmin * m are exact (11-bit by 6-bit mantissas), as are the legacy kinds'
   products d * q; the one rounding is the final (d * q) + m, (d * sc) * q - dmin * m or (d * sc) * q.

   F32, F16 and BF16 rows are read in groups of 32 values (QK_F), so every kind is a sequence of blocks. */
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum tq_kind {
    TQ_F32 = 0, TQ_F16 = 1, TQ_Q4_0 = 2, TQ_Q4_1 = 3, TQ_Q5_0 = 6, TQ_Q5_1 = 7, TQ_Q8_0 = 8,
    TQ_Q4_K = 12, TQ_Q5_K = 13, TQ_Q6_K = 14, TQ_BF16 = 30,
    /* a legacy kind's blocks with their fp16 scales widened to fp32 (tq_repack_scaled): the same weights, read
       with one broadcast load a scale instead of a conversion and in-register broadcasts */
    TQ_SCALED = 256,
    TQ_Q4_0S = TQ_SCALED + TQ_Q4_0, TQ_Q4_1S = TQ_SCALED + TQ_Q4_1, TQ_Q5_0S = TQ_SCALED + TQ_Q5_0,
    TQ_Q5_1S = TQ_SCALED + TQ_Q5_1, TQ_Q8_0S = TQ_SCALED + TQ_Q8_0,
};

#define QK 32      /* weights in a legacy block (Q4_0 ... Q8_0) */
#define QK_K 256   /* weights in a K-quant super-block */
#define QK_F 32    /* F32/F16/BF16 values read as one group */

typedef uint16_t tq_half;   /* IEEE binary16 bits */

typedef struct { tq_half d; uint8_t qs[QK / 2]; } block_q4_0;              /* w = d * (q - 8) */
typedef struct { tq_half d, m; uint8_t qs[QK / 2]; } block_q4_1;           /* w = (d * q) + m */
typedef struct { tq_half d; uint8_t qh[4]; uint8_t qs[QK / 2]; } block_q5_0;   /* w = d * (q - 16) */
typedef struct { tq_half d, m; uint8_t qh[4]; uint8_t qs[QK / 2]; } block_q5_1; /* w = (d * q) + m */
typedef struct { tq_half d; int8_t qs[QK]; } block_q8_0;                  /* w = q * d */
/* 8 sub-blocks of 32: 6-bit scale sc and min m each, packed in scales[12] (tq_scale_min_k4) */
typedef struct { tq_half d, dmin; uint8_t scales[12]; uint8_t qs[QK_K / 2]; } block_q4_K;
typedef struct { tq_half d, dmin; uint8_t scales[12]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; } block_q5_K;
/* 16 sub-blocks of 16: int8 scale each; q = 4 low bits (ql) | 2 high bits (qh), minus 32 */
typedef struct { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; tq_half d; } block_q6_K;

_Static_assert(sizeof(block_q4_0) == 18 && sizeof(block_q4_1) == 20 && sizeof(block_q5_0) == 22 &&
               sizeof(block_q5_1) == 24 && sizeof(block_q8_0) == 34 && sizeof(block_q4_K) == 144 &&
               sizeof(block_q5_K) == 176 && sizeof(block_q6_K) == 210, "GGUF block sizes");

/* A legacy block (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) is its scales (d; Q4_1/Q5_1 also m) then the rest (Q5: qh[4];
   then qs). Its scaled form (TQ_SCALED + kind) is the same block with each scale as fp32: 4 bytes more a block
   (2 more for Q4_0/Q5_0/Q8_0), and no conversion when read. */
static inline int tq_is_scaled(int kind) { return kind >= TQ_SCALED; }
static inline int tq_scales(int kind) {
    const int base = kind >= TQ_SCALED ? kind - TQ_SCALED : kind;
    return base == TQ_Q4_1 || base == TQ_Q5_1 ? 2 : 1;
}
static inline int tq_scale_bytes(int kind) { return tq_scales(kind) * (kind >= TQ_SCALED ? 4 : 2); }

/* Weights per block, and bytes per block (0: a kind these kernels do not read). */
static inline int tq_block_weights(int kind) {
    return kind == TQ_Q4_K || kind == TQ_Q5_K || kind == TQ_Q6_K ? QK_K : QK;
}

static inline int tq_block_bytes(int kind) {
    switch (kind) {
    case TQ_F32: return 4 * QK_F;
    case TQ_F16: case TQ_BF16: return 2 * QK_F;
    case TQ_Q4_0: return sizeof(block_q4_0);
    case TQ_Q4_1: return sizeof(block_q4_1);
    case TQ_Q5_0: return sizeof(block_q5_0);
    case TQ_Q5_1: return sizeof(block_q5_1);
    case TQ_Q8_0: return sizeof(block_q8_0);
    case TQ_Q4_K: return sizeof(block_q4_K);
    case TQ_Q5_K: return sizeof(block_q5_K);
    case TQ_Q6_K: return sizeof(block_q6_K);
    case TQ_Q4_0S: case TQ_Q4_1S: case TQ_Q5_0S: case TQ_Q5_1S: case TQ_Q8_0S:
        return tq_block_bytes(kind - TQ_SCALED) + tq_scale_bytes(kind) - tq_scale_bytes(kind - TQ_SCALED);
    default: return 0;
    }
}

/* Unaligned little-endian reads (blocks sit at any even offset of a memory-mapped file). */
static inline uint16_t tq_u16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline uint32_t tq_u32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }

static inline float tq_f32_bits(uint32_t w) { float f; memcpy(&f, &w, 4); return f; }
static inline uint32_t tq_bits_f32(float f) { uint32_t w; memcpy(&w, &f, 4); return w; }

/* binary16 -> binary32, exact for every input (normals, subnormals, zeros, inf, NaN): the exponent is
   rebased by one multiply by a power of two; subnormals come out of a subtraction against a magic number.
   Branch-free integer and fp32 arithmetic, so loops over it vectorise. */
static inline float tq_half_to_float(uint16_t h) {
    const uint32_t w = (uint32_t)h << 16;
    const uint32_t sign = w & 0x80000000u;
    const uint32_t two_w = w + w;
    const float normalized = tq_f32_bits((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
    const float denormalized = tq_f32_bits((two_w >> 17) | (126u << 23)) - 0.5f;
    const uint32_t small = 0u - (uint32_t)(two_w < (1u << 27));          /* all ones for zeros and subnormals */
    const uint32_t bits = (tq_bits_f32(denormalized) & small) | (tq_bits_f32(normalized) & ~small);
    return tq_f32_bits(sign | bits);
}

static inline float tq_bf16_to_float(uint16_t h) { return tq_f32_bits((uint32_t)h << 16); }

/* Q4_K / Q5_K: the 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes. */
static inline void tq_scale_min_k4(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* A Q4_K / Q5_K super-block's sub-block scales d * sc[j] and offsets dmin * m[j] (both exact: 11-bit by
   6-bit mantissas), and where its 4-bit (qs) and fifth-bit (qh, Q5_K) arrays start. */
typedef struct { float dsc[8], dm[8]; const uint8_t *qs, *qh; } tq_k4_block;

static inline void tq_k4_decode(int kind, const uint8_t *b, tq_k4_block *k) {
    const float d = tq_half_to_float(tq_u16(b)), dmin = tq_half_to_float(tq_u16(b + 2));
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        tq_scale_min_k4(j, b + offsetof(block_q4_K, scales), &sc, &m);
        k->dsc[j] = d * (float)sc;
        k->dm[j] = dmin * (float)m;
    }
    k->qs = b + (kind == TQ_Q5_K ? offsetof(block_q5_K, qs) : offsetof(block_q4_K, qs));
    k->qh = b + offsetof(block_q5_K, qh);
}

/* Scale i of a legacy block at b, in the file's layout (fp16) or the scaled one (fp32): the same value. */
static inline float tq_scale(int kind, const uint8_t *b, int i) {
    return kind >= TQ_SCALED ? tq_f32_bits(tq_u32(b + 4 * i)) : tq_half_to_float(tq_u16(b + 2 * i));
}

/* ---- one block -> its weights, as gguf-py computes them -------------------------------------------- */
/* (legacy kinds: either layout, ``kind`` saying which; qh (Q5) and qs follow the scales) */
static inline void tq_dequant_q4_0(int kind, const uint8_t *b, float *y) {
    const float d = tq_scale(kind, b, 0);
    const uint8_t *qs = b + tq_scale_bytes(kind);
    for (int j = 0; j < QK / 2; j++) {
        y[j] = d * (float)((qs[j] & 0x0F) - 8);
        y[j + QK / 2] = d * (float)((qs[j] >> 4) - 8);
    }
}

static inline void tq_dequant_q4_1(int kind, const uint8_t *b, float *y) {
    const float d = tq_scale(kind, b, 0), m = tq_scale(kind, b, 1);
    const uint8_t *qs = b + tq_scale_bytes(kind);
    for (int j = 0; j < QK / 2; j++) {
        y[j] = (d * (float)(qs[j] & 0x0F)) + m;
        y[j + QK / 2] = (d * (float)(qs[j] >> 4)) + m;
    }
}

static inline void tq_dequant_q5_0(int kind, const uint8_t *b, float *y) {
    const float d = tq_scale(kind, b, 0);
    const uint32_t qh = tq_u32(b + tq_scale_bytes(kind));
    const uint8_t *qs = b + tq_scale_bytes(kind) + 4;
    for (int j = 0; j < QK / 2; j++) {
        const int lo = (qs[j] & 0x0F) | (int)(((qh >> j) & 1) << 4);
        const int hi = (qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
        y[j] = d * (float)(lo - 16);
        y[j + QK / 2] = d * (float)(hi - 16);
    }
}

static inline void tq_dequant_q5_1(int kind, const uint8_t *b, float *y) {
    const float d = tq_scale(kind, b, 0), m = tq_scale(kind, b, 1);
    const uint32_t qh = tq_u32(b + tq_scale_bytes(kind));
    const uint8_t *qs = b + tq_scale_bytes(kind) + 4;
    for (int j = 0; j < QK / 2; j++) {
        const int lo = (qs[j] & 0x0F) | (int)(((qh >> j) & 1) << 4);
        const int hi = (qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
        y[j] = (d * (float)lo) + m;
        y[j + QK / 2] = (d * (float)hi) + m;
    }
}

static inline void tq_dequant_q8_0(int kind, const uint8_t *b, float *y) {
    const float d = tq_scale(kind, b, 0);
    const int8_t *qs = (const int8_t *)(b + tq_scale_bytes(kind));
    for (int j = 0; j < QK; j++) y[j] = (float)qs[j] * d;
}

static inline void tq_dequant_q4_K(const uint8_t *b, float *y) {
    tq_k4_block k;
    tq_k4_decode(TQ_Q4_K, b, &k);
    for (int g = 0; g < QK_K / 64; g++) {            /* sub-blocks 2g, 2g + 1: low, high nibbles of qs[32 g..] */
        const uint8_t *q = k.qs + 32 * g;
        for (int l = 0; l < 32; l++) y[64 * g + l] = k.dsc[2 * g] * (float)(q[l] & 0x0F) - k.dm[2 * g];
        for (int l = 0; l < 32; l++) y[64 * g + 32 + l] = k.dsc[2 * g + 1] * (float)(q[l] >> 4) - k.dm[2 * g + 1];
    }
}

static inline void tq_dequant_q5_K(const uint8_t *b, float *y) {
    tq_k4_block k;
    tq_k4_decode(TQ_Q5_K, b, &k);
    for (int j = 0; j < QK_K / 32; j++) {            /* as Q4_K, plus bit j of qh[l] as the fifth bit */
        const uint8_t *q = k.qs + (j / 2) * 32;
        const int shift = (j % 2) * 4;
        for (int l = 0; l < 32; l++) {
            const int v = ((q[l] >> shift) & 0x0F) | (((k.qh[l] >> j) & 1) << 4);
            y[j * 32 + l] = k.dsc[j] * (float)v - k.dm[j];
        }
    }
}

static inline void tq_dequant_q6_K(const uint8_t *b, float *y) {
    const float d = tq_half_to_float(tq_u16(b + offsetof(block_q6_K, d)));
    const uint8_t *ql = b + offsetof(block_q6_K, ql), *qh = b + offsetof(block_q6_K, qh);
    const int8_t *scales = (const int8_t *)(b + offsetof(block_q6_K, scales));
    /* weight i = 128 h + 32 t + l (h: half, t: 0..3, l: 0..31): low 4 bits from ql[64 h + 32 (t % 2) + l]
       (nibble t / 2), high 2 bits from qh[32 h + l] (bits 2t, 2t + 1); sub-block i / 16. Runs of 16 weights
       (one sub-block, constant shifts: the inner loop vectorises) */
    for (int sub = 0; sub < QK_K / 16; sub++) {
        const int h = sub / 8, t = (sub / 2) % 4, l0 = 16 * (sub % 2);
        const float ds = d * (float)scales[sub];
        const uint8_t *lo = ql + 64 * h + 32 * (t % 2) + l0, *hi = qh + 32 * h + l0;
        for (int l = 0; l < 16; l++) {
            const int q = ((lo[l] >> (4 * (t / 2))) & 0x0F) | (((hi[l] >> (2 * t)) & 3) << 4);
            y[16 * sub + l] = ds * (float)(q - 32);
        }
    }
}

/* One block of any kind (``b`` its first byte) -> tq_block_weights(kind) weights. */
static inline __attribute__((always_inline)) void tq_dequant_block(int kind, const uint8_t *b, float *y) {
    switch (kind) {
    case TQ_F32: memcpy(y, b, 4 * QK_F); break;
    case TQ_F16: for (int j = 0; j < QK_F; j++) y[j] = tq_half_to_float(tq_u16(b + 2 * j)); break;
    case TQ_BF16: for (int j = 0; j < QK_F; j++) y[j] = tq_bf16_to_float(tq_u16(b + 2 * j)); break;
    case TQ_Q4_0: case TQ_Q4_0S: tq_dequant_q4_0(kind, b, y); break;
    case TQ_Q4_1: case TQ_Q4_1S: tq_dequant_q4_1(kind, b, y); break;
    case TQ_Q5_0: case TQ_Q5_0S: tq_dequant_q5_0(kind, b, y); break;
    case TQ_Q5_1: case TQ_Q5_1S: tq_dequant_q5_1(kind, b, y); break;
    case TQ_Q8_0: case TQ_Q8_0S: tq_dequant_q8_0(kind, b, y); break;
    case TQ_Q4_K: tq_dequant_q4_K(b, y); break;
    case TQ_Q5_K: tq_dequant_q5_K(b, y); break;
    case TQ_Q6_K: tq_dequant_q6_K(b, y); break;
    default: break;
    }
}

/* Every kernel's GEMM takes the same arguments:
     kind: an enum tq_kind; x [n, inner] fp32 (row-major); w: the weight's first byte, row o at w + o * ldw
     (inner / QK(kind) blocks); bias [out] or NULL; y: row r at y + r * ldy, columns 0..out-1;
     threads: OpenMP threads over the output columns (each y[r, o] is computed by one thread).
   Returns 0, or -1 for a kind it does not read or an inner size that is not whole blocks. */
#define TQ_GEMM_ARGS int kind, const float *x, int64_t n, int64_t inner, const uint8_t *w, int64_t ldw, \
                     int64_t out, const float *bias, float *y, int64_t ldy, int threads

static inline int tq_gemm_shape_ok(int kind, int64_t inner) {
    return tq_block_bytes(kind) > 0 && inner > 0 && inner % tq_block_weights(kind) == 0;
}
