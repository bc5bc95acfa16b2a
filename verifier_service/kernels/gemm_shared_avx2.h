/* AVX2 helpers shared by gemm_avx2.c, gemm_avx512.c and gemm_q8_x86.h.

   Q6_K chunk s (32 weights) of the block at blk as 32 signed bytes q - 32, with AVX2 byte operations.
   Chunk s = 4 h + t (see tq_dequant_q6_K): low 4 bits of ql[64 h + 32 (t % 2) + l] (nibble t / 2), high 2
   bits of qh[32 h + l] (bits 2t, 2t + 1). */
#pragma once
#include <immintrin.h>

#include "quants.h"

/* An fp16 at p (little-endian) as fp32, by F16C. */
static inline float half(const uint8_t *p) { return _cvtsh_ss(tq_u16(p)); }

/* Scale i of a legacy block at p (tq_scale, with F16C for the file's fp16 layout). In the scaled layout it is a
   plain fp32 load, which a broadcast of it takes as its memory operand: no shuffle unit. */
static inline float scale_value(int kind, const uint8_t *p, int i) {
    return tq_is_scaled(kind) ? tq_f32_bits(tq_u32(p + 4 * i)) : half(p + 2 * i);
}

static inline __m256i q6_k_chunk(const uint8_t *blk, int s) {
    const uint8_t *ql = blk + offsetof(block_q6_K, ql), *qh = blk + offsetof(block_q6_K, qh);
    const int h = s / 4, t = s % 4;
    const __m256i l = _mm256_loadu_si256((const __m256i *)(ql + 64 * h + 32 * (t % 2)));
    const __m256i u = _mm256_loadu_si256((const __m256i *)(qh + 32 * h));
    const __m256i lo4 = _mm256_and_si256(_mm256_srl_epi16(l, _mm_cvtsi32_si128(4 * (t / 2))), _mm256_set1_epi8(0x0F));
    const __m256i hi2 = _mm256_and_si256(_mm256_srl_epi16(u, _mm_cvtsi32_si128(2 * t)), _mm256_set1_epi8(0x03));
    return _mm256_sub_epi8(_mm256_or_si256(lo4, _mm256_slli_epi16(hi2, 4)), _mm256_set1_epi8(32));
}

/* A legacy block's 32 nibbles as bytes in weight order: the low nibbles of qs[0..15] (weights 0-15), then the
   high ones (16-31). */
static inline __m256i nibble_bytes(const uint8_t *qs) {
    const __m128i v = _mm_loadu_si128((const __m128i *)qs), m = _mm_set1_epi8(0x0F);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m), _mm_and_si128(v, m));
}

/* A Q5_0/Q5_1 block's fifth bits as bytes: 0x10 in byte j where bit j of qh is set, else 0 (byte j / 8 of qh
   picked into each lane by a shuffle, then each lane's own bit tested by one compare, as llama.cpp does). */
static inline __m256i fifth_bit_bytes(uint32_t qh) {
    const __m256i spread = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    const __m256i b = _mm256_or_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), spread),
                                      _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    return _mm256_and_si256(_mm256_cmpeq_epi8(b, _mm256_set1_epi64x(-1)), _mm256_set1_epi8(0x10));
}

/* The scale of 16-weight sub-block i of the Q6_K block at blk: d * scales[i]. */
static inline float q6_k_scale(const uint8_t *blk, int i) {
    return half(blk + offsetof(block_q6_K, d)) * (float)((const int8_t *)(blk + offsetof(block_q6_K, scales)))[i];
}
