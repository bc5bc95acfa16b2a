/* The int8-activation GEMM on the x8 layout (gemm_q8.h: 8 weight rows interleaved) for Q4_0, Q4_1, Q5_0,
   Q8_0, Q4_K, Q5_K and Q6_K, x86 paths. Per 32-weight chunk: one conversion gives the 8 rows' scales, and per lane l one
   32-byte load gives weights 4l..4l+3 of the 8 rows; x's 4 bytes 4l..4l+3 are broadcast to every lane, so
   vpmaddubsw gives each row's products in pairs (int16) and the chunk's pairs add up in int16 (Q8_0: in
   int32 after vpmaddwd) into one exact integer per row and chunk: then one conversion and one FMA per chunk
   for 8 outputs (gemm_q8.h's arithmetic, so each y[r, o] is bit-identical to gemm_q8_x86.h's kernel and to
   gemm_q8_generic.c). No overflow: a nibble pair is at most 2 * 15 * 127 = 3 810 and a chunk's 16 pairs
   30 480; a Q8_0 pair at most 2 * 128 * 127 = 32 512.

   Q4_0's nibbles go in unsigned (no sign instructions): sum (q - 8) x = sum q x - 8 sum x, with sum x the
   x block's integer sum (q8_rows.t). Up to ROWS_X8 rows of x share each chunk's loads and unpacking, one
   accumulator (and one offset sum) each; the group's chunks stay in L1 between passes.

   Included after gemm_q8_dispatch.h (for q8_quantize) by gemm_q8_<x86 isa>.c, which names the entry
   points TQ_GEMM_Q8X8_NAME and TQ_GEMM_PARTS_Q8X8_NAME. */

#define ROWS_X8 4

/* Keeps a running integer sum in its register where it is: without it gcc reassociates the chunk's adds into
   a tree over all products at once, which spills them to the stack (integer sums: the same value). Not
   where the intrinsics are emulated (no AVX2 registers: the tests' SIMDe build). */
#ifdef __AVX2__
#define Q8X8_KEEP(v) __asm__("" : "+x"(v))
#else
#define Q8X8_KEEP(v) ((void)0)
#endif

/* 8 outputs of rows r0..r0+N-1 of x: (acc + msum) + bias, as gemm_q8.h ends a row. */
static inline __attribute__((always_inline)) void q8x8_store(int N, const __m256 *acc, const __m256 *ms,
                                                             const float *bias, float *y, int64_t ldy) {
    const __m256 b8 = bias ? _mm256_loadu_ps(bias) : _mm256_setzero_ps();
    for (int r = 0; r < N; r++) _mm256_storeu_ps(y + r * ldy, _mm256_add_ps(_mm256_add_ps(acc[r], ms[r]), b8));
}

/* Q4_0, Q4_1, Q5_0, Q8_0: rows r0..r0+N-1 of x against group g (p: its first byte): y[r, o..o+7]. */
static inline __attribute__((always_inline)) void q8x8_legacy_rows(int kind, int N, const q8_rows *xr, int64_t r0,
                                                                   int64_t inner, const uint8_t *p,
                                                                   const float *bias, float *y, int64_t ldy) {
    const int64_t nb = inner / 32, cb = tq_q8x8_chunk_bytes(kind);
    const int qs_at = tq_q8x8_qs_offset(kind);
    const __m256i nib = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    const int32_t *x4[ROWS_X8];
    __m256 acc[ROWS_X8], ms[ROWS_X8];
    for (int r = 0; r < N; r++) acc[r] = ms[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *c8 = p + b * cb;
        for (int r = 0; r < N; r++) x4[r] = (const int32_t *)(xr->q + (r0 + r) * inner + 32 * b);
        __m256i L[ROWS_X8];
        if (kind == TQ_Q8_0) {
            for (int r = 0; r < N; r++) L[r] = _mm256_setzero_si256();
            for (int l = 0; l < 8; l++) {
                const __m256i w = _mm256_loadu_si256((const __m256i *)(c8 + qs_at + 32 * l));
                const __m256i aw = _mm256_sign_epi8(w, w);              /* |w|, x carrying w's sign */
                for (int r = 0; r < N; r++) {
                    L[r] = _mm256_add_epi32(L[r], _mm256_madd_epi16(_mm256_maddubs_epi16(
                               aw, _mm256_sign_epi8(_mm256_set1_epi32(x4[r][l]), w)), ones));
                    Q8X8_KEEP(L[r]);
                }
            }
        } else if (kind == TQ_Q5_0) {
            /* lane l's fifth bits: bits 4l..4l+3 (low nibbles) and 16 + 4l.. (high) of each row's qh, that is
               byte l / 2 (and 2 + l / 2) at bit 4 (l % 2): broadcast to the row's 4 bytes, one bit each, to 0x10 */
            const __m256i QH = _mm256_loadu_si256((const __m256i *)(c8 + 16)), five = _mm256_set1_epi8(0x10);
            __m256i s[2][ROWS_X8];
            for (int r = 0; r < N; r++) s[0][r] = s[1][r] = _mm256_setzero_si256();
            for (int l = 0; l < 4; l++) {
                const __m256i sel = _mm256_set1_epi32((int)(0x08040201u << (4 * (l % 2))));
                const __m256i blo = _mm256_set1_epi32(0x01010101 * (l / 2)) , bhi = _mm256_set1_epi32(0x01010101 * (2 + l / 2));
                const __m256i dw = _mm256_setr_epi8(0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12,
                                                    0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12);
                const __m256i flo = _mm256_shuffle_epi8(QH, _mm256_add_epi8(dw, blo));
                const __m256i fhi = _mm256_shuffle_epi8(QH, _mm256_add_epi8(dw, bhi));
                const __m256i q = _mm256_loadu_si256((const __m256i *)(c8 + qs_at + 32 * l));
                const __m256i lo = _mm256_or_si256(_mm256_and_si256(q, nib),
                                                   _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(flo, sel), sel), five));
                const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), nib),
                                                   _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(fhi, sel), sel), five));
                for (int r = 0; r < N; r++) {        /* two lanes' pairs a sum: at most 8 * 31 * 127 = 31 496 */
                    s[l / 2][r] = _mm256_add_epi16(s[l / 2][r], _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_set1_epi32(x4[r][l])),
                                                                                 _mm256_maddubs_epi16(hi, _mm256_set1_epi32(x4[r][l + 4]))));
                    Q8X8_KEEP(s[l / 2][r]);
                }
            }
            for (int r = 0; r < N; r++)               /* sum (q - 16) x = sum q x - 16 sum x */
                L[r] = _mm256_sub_epi32(_mm256_add_epi32(_mm256_madd_epi16(s[0][r], ones), _mm256_madd_epi16(s[1][r], ones)),
                                        _mm256_set1_epi32(16 * xr->t[(r0 + r) * nb + b]));
        } else {
            __m256i s[ROWS_X8];
            for (int r = 0; r < N; r++) s[r] = _mm256_setzero_si256();
            for (int l = 0; l < 4; l++) {
                const __m256i q = _mm256_loadu_si256((const __m256i *)(c8 + qs_at + 32 * l));
                const __m256i lo = _mm256_and_si256(q, nib), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), nib);
                for (int r = 0; r < N; r++) {
                    s[r] = _mm256_add_epi16(s[r], _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_set1_epi32(x4[r][l])),
                                                                   _mm256_maddubs_epi16(hi, _mm256_set1_epi32(x4[r][l + 4]))));
                    Q8X8_KEEP(s[r]);
                }
            }
            for (int r = 0; r < N; r++) {
                L[r] = _mm256_madd_epi16(s[r], ones);
                if (kind == TQ_Q4_0) L[r] = _mm256_sub_epi32(L[r], _mm256_set1_epi32(8 * xr->t[(r0 + r) * nb + b]));
            }
        }
        const __m256 D = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)c8));
        for (int r = 0; r < N; r++)
            acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(D, _mm256_set1_ps(xr->d[(r0 + r) * nb + b])),
                                     _mm256_cvtepi32_ps(L[r]), acc[r]);
        if (kind == TQ_Q4_1) {
            const __m256 M = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(c8 + 16)));
            for (int r = 0; r < N; r++) ms[r] = _mm256_fmadd_ps(M, _mm256_set1_ps(xr->s[(r0 + r) * nb + b]), ms[r]);
        }
    }
    q8x8_store(N, acc, ms, bias, y + r0 * ldy, ldy);
}

/* Q4_K/Q5_K super-block b at s8: adds its 8 chunks' offsets -(dmin * m) times each row's block sums to ms (in
   chunk order) and returns the 8 rows' d. */
static inline __attribute__((always_inline)) __m256 q8x8_k4_offsets(int N, const q8_rows *xr, int64_t r0, int64_t nb,
                                                                    int64_t b, const uint8_t *s8, __m256 *ms) {
    const __m256 DM = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s8 + 16)));
    for (int k = 0; k < 8; k++) {
        const __m256 m = _mm256_mul_ps(DM, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
                             _mm_loadl_epi64((const __m128i *)(s8 + TQ_K4X8_M + 8 * k)))));
        const __m256 neg = _mm256_xor_ps(m, _mm256_set1_ps(-0.0f));
        for (int r = 0; r < N; r++) ms[r] = _mm256_fmadd_ps(neg, _mm256_set1_ps(xr->s[(r0 + r) * nb + 8 * b + k]), ms[r]);
    }
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)s8));
}

/* Chunk c's d * sc for the 8 rows (the products quants.h's tq_k4_decode makes). */
static inline __attribute__((always_inline)) __m256 q8x8_k4_scale(__m256 D, const uint8_t *s8, int c) {
    return _mm256_mul_ps(D, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(s8 + TQ_K4X8_SC + 8 * c)))));
}

/* Q4_K: rows r0..r0+N-1 of x against group g, per super-block: the offsets -(dmin * m) of its 8 chunks,
   then chunk pairs from one byte array (low nibbles: chunk 2pr, high: 2pr + 1), each chunk's 8 rows'
   d * sc (the products quants.h's tq_k4_decode makes) times d_b. */
static inline __attribute__((always_inline)) void q8x8_q4_k_rows(int N, const q8_rows *xr, int64_t r0, int64_t inner,
                                                                 const uint8_t *p, const float *bias, float *y,
                                                                 int64_t ldy) {
    const int64_t nb = inner / 32;
    const __m256i nib = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    __m256 acc[ROWS_X8], ms[ROWS_X8];
    for (int r = 0; r < N; r++) acc[r] = ms[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < inner / QK_K; b++) {
        const uint8_t *s8 = p + b * 8 * tq_q8x8_chunk_bytes(TQ_Q4_K);
        const __m256 D = q8x8_k4_offsets(N, xr, r0, nb, b, s8, ms);
        for (int c = 0; c < 8; c++) {                    /* chunk c: the low (c even) or high nibbles of pair c / 2 */
            const __m256 SC = q8x8_k4_scale(D, s8, c);
            const int64_t xb = 8 * b + c;
            __m256i s[ROWS_X8];
            for (int r = 0; r < N; r++) s[r] = _mm256_setzero_si256();
            for (int l = 0; l < 8; l++) {
                const __m256i q = _mm256_loadu_si256((const __m256i *)(s8 + tq_k4x8_qs_offset(TQ_Q4_K) + 32 * (8 * (c / 2) + l)));
                const __m256i w = _mm256_and_si256(c % 2 ? _mm256_srli_epi16(q, 4) : q, nib);
                for (int r = 0; r < N; r++) {
                    s[r] = _mm256_add_epi16(s[r], _mm256_maddubs_epi16(w, _mm256_set1_epi32(
                               ((const int32_t *)(xr->q + (r0 + r) * inner + 32 * xb))[l])));
                    Q8X8_KEEP(s[r]);
                }
            }
            for (int r = 0; r < N; r++)
                acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(SC, _mm256_set1_ps(xr->d[(r0 + r) * nb + xb])),
                                         _mm256_cvtepi32_ps(_mm256_madd_epi16(s[r], ones)), acc[r]);
        }
    }
    q8x8_store(N, acc, ms, bias, y + r0 * ldy, ldy);
}

/* Q5_K: Q4_K's loop with each lane's fifth bits (bit c of the lane's qh bytes for chunk c) moved to 0x10;
   weights up to 31, so a chunk's lanes 0-3 and 4-7 add up in int16 apart (at most 8 * 31 * 127 = 31 496 each)
   and then in int32: the same integers as gemm_q8.h, the same FMAs. */
static inline __attribute__((always_inline)) void q8x8_q5_k_rows(int N, const q8_rows *xr, int64_t r0, int64_t inner,
                                                                 const uint8_t *p, const float *bias, float *y,
                                                                 int64_t ldy) {
    const int64_t nb = inner / 32;
    const __m256i nib = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(0x01), ones = _mm256_set1_epi16(1);
    __m256 acc[ROWS_X8], ms[ROWS_X8];
    for (int r = 0; r < N; r++) acc[r] = ms[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < inner / QK_K; b++) {
        const uint8_t *s8 = p + b * 8 * tq_q8x8_chunk_bytes(TQ_Q5_K);
        const __m256 D = q8x8_k4_offsets(N, xr, r0, nb, b, s8, ms);
        for (int c = 0; c < 8; c++) {
            const __m256 SC = q8x8_k4_scale(D, s8, c);
            const __m128i bit = _mm_cvtsi32_si128(c);
            const int64_t xb = 8 * b + c;
            __m256i s[2][ROWS_X8];
            for (int r = 0; r < N; r++) s[0][r] = s[1][r] = _mm256_setzero_si256();
            for (int l = 0; l < 8; l++) {
                const __m256i q = _mm256_loadu_si256((const __m256i *)(s8 + tq_k4x8_qs_offset(TQ_Q5_K) + 32 * (8 * (c / 2) + l)));
                const __m256i h = _mm256_and_si256(_mm256_srl_epi16(_mm256_loadu_si256((const __m256i *)(s8 + TQ_K5X8_QH + 32 * l)), bit), one);
                const __m256i w = _mm256_or_si256(_mm256_and_si256(c % 2 ? _mm256_srli_epi16(q, 4) : q, nib),
                                                  _mm256_slli_epi16(h, 4));
                for (int r = 0; r < N; r++) {
                    s[l / 4][r] = _mm256_add_epi16(s[l / 4][r], _mm256_maddubs_epi16(w, _mm256_set1_epi32(
                                      ((const int32_t *)(xr->q + (r0 + r) * inner + 32 * xb))[l])));
                    Q8X8_KEEP(s[l / 4][r]);
                }
            }
            for (int r = 0; r < N; r++)
                acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(SC, _mm256_set1_ps(xr->d[(r0 + r) * nb + xb])),
                                         _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_madd_epi16(s[0][r], ones),
                                                                             _mm256_madd_epi16(s[1][r], ones))), acc[r]);
        }
    }
    q8x8_store(N, acc, ms, bias, y + r0 * ldy, ldy);
}

#ifdef TQ_Q8X8_512
/* Q4_K on the avx512 path: the loop above with two lanes a register. One 64-byte load holds lanes l and l + 1
   (adjacent in the layout), x's dwords l and l + 1 go to the low and high halves (one permute), and the
   int16 sums of the two halves are added at the end of the chunk: the same integers per row and chunk (at
   most 16 pairs of 2 * 15 * 127 in int16, as above), so the same FMAs and the same bits. (The same change to
   Q6_K's loop measured slower on Zen 5 with 2 threads on a 3 B file: BENCHMARKS.md, fifteenth session.) */
static inline __attribute__((always_inline)) void q8x8_q4_k_rows512(int N, const q8_rows *xr, int64_t r0, int64_t inner,
                                                                    const uint8_t *p, const float *bias, float *y,
                                                                    int64_t ldy) {
    const int64_t nb = inner / 32;
    const __m512i nib = _mm512_set1_epi8(0x0F);
    const __m256i ones = _mm256_set1_epi16(1);
    __m512i pick[4];                                      /* dwords 2j (low half) and 2j + 1 (high half) */
    for (int j = 0; j < 4; j++)
        pick[j] = _mm512_inserti64x4(_mm512_set1_epi32(2 * j), _mm256_set1_epi32(2 * j + 1), 1);
    __m256 acc[ROWS_X8], ms[ROWS_X8];
    for (int r = 0; r < N; r++) acc[r] = ms[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < inner / QK_K; b++) {
        const uint8_t *s8 = p + b * 8 * tq_q8x8_chunk_bytes(TQ_Q4_K);
        const __m256 D = q8x8_k4_offsets(N, xr, r0, nb, b, s8, ms);
        for (int c = 0; c < 8; c++) {
            const __m256 SC = q8x8_k4_scale(D, s8, c);
            const int64_t xb = 8 * b + c;
            __m512i s[ROWS_X8], xv[ROWS_X8];
            for (int r = 0; r < N; r++) {
                s[r] = _mm512_setzero_si512();
                xv[r] = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(xr->q + (r0 + r) * inner + 32 * xb)));
            }
            for (int j = 0; j < 4; j++) {
                const __m512i q = _mm512_loadu_si512((const void *)(s8 + tq_k4x8_qs_offset(TQ_Q4_K) + 32 * (8 * (c / 2) + 2 * j)));
                const __m512i w = _mm512_and_si512(c % 2 ? _mm512_srli_epi16(q, 4) : q, nib);
                for (int r = 0; r < N; r++) {
                    s[r] = _mm512_add_epi16(s[r], _mm512_maddubs_epi16(w, _mm512_permutexvar_epi32(pick[j], xv[r])));
                    Q8X8_KEEP(s[r]);
                }
            }
            for (int r = 0; r < N; r++) {
                const __m256i s16 = _mm256_add_epi16(_mm512_castsi512_si256(s[r]), _mm512_extracti64x4_epi64(s[r], 1));
                acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(SC, _mm256_set1_ps(xr->d[(r0 + r) * nb + xb])),
                                         _mm256_cvtepi32_ps(_mm256_madd_epi16(s16, ones)), acc[r]);
            }
        }
    }
    q8x8_store(N, acc, ms, bias, y + r0 * ldy, ldy);
}
#endif

/* Q6_K: rows r0..r0+N-1 of x against group g, per super-block: chunk c = 4h + t rebuilds each lane's 6-bit
   weights q (0..63) from a nibble of ql pair 2h + t % 2 and bits 2t, 2t + 1 of qh half h, moved to bits 4-5 by
   one shift. They go in unsigned, as Q4_0's do: sum (q - 32) x = sum q x - 32 sum x, with sum x over the
   16 weights of each scale (q8_rows.h: weights 0-15; t - h: 16-31). Two lanes' pairs add up in int16 (at most
   4 * 63 * 127 = 32 004), then in int32. Per chunk two exact sums (weights 0-15, 16-31), each times its own
   scale d * sc, two FMAs in that order: gemm_q8.h's Q6_K. */
static inline __attribute__((always_inline)) void q8x8_q6_k_rows(int N, const q8_rows *xr, int64_t r0, int64_t inner,
                                                                 const uint8_t *p, const float *bias, float *y,
                                                                 int64_t ldy) {
    const int64_t nb = inner / 32;
    const __m256i nib = _mm256_set1_epi8(0x0F), top = _mm256_set1_epi8(0x30), ones = _mm256_set1_epi16(1);
    __m256 acc[ROWS_X8], ms[ROWS_X8];
    for (int r = 0; r < N; r++) acc[r] = ms[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < inner / QK_K; b++) {
        const uint8_t *s8 = p + b * 8 * tq_q8x8_chunk_bytes(TQ_Q6_K);
        const __m256 D = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)s8));
        for (int c = 0; c < 8; c++) {
            const int h = c / 4, t = c % 4;
            const uint8_t *ql = s8 + TQ_Q6X8_QL + 32 * 8 * (2 * h + t % 2), *qh = s8 + TQ_Q6X8_QH + 32 * 8 * h;
            const __m128i lsh = _mm_cvtsi32_si128(4 * (t / 2)), up = _mm_cvtsi32_si128(t < 3 ? 4 - 2 * t : 0),
                          down = _mm_cvtsi32_si128(t == 3 ? 2 : 0);
            const int64_t xb = 8 * b + c;
            __m256i L[2][ROWS_X8];
            for (int half = 0; half < 2; half++) {
                __m256i w[4];
                for (int i = 0; i < 4; i++) {
                    const int l = 4 * half + i;
                    const __m256i lo = _mm256_and_si256(_mm256_srl_epi16(_mm256_loadu_si256((const __m256i *)(ql + 32 * l)), lsh), nib);
                    const __m256i u = _mm256_loadu_si256((const __m256i *)(qh + 32 * l));
                    w[i] = _mm256_or_si256(lo, _mm256_and_si256(_mm256_srl_epi16(_mm256_sll_epi16(u, up), down), top));
                }
                for (int r = 0; r < N; r++) {
                    const int32_t *x4 = (const int32_t *)(xr->q + (r0 + r) * inner + 32 * xb) + 4 * half;
                    __m256i a = _mm256_add_epi16(_mm256_maddubs_epi16(w[0], _mm256_set1_epi32(x4[0])),
                                                 _mm256_maddubs_epi16(w[1], _mm256_set1_epi32(x4[1])));
                    __m256i e = _mm256_add_epi16(_mm256_maddubs_epi16(w[2], _mm256_set1_epi32(x4[2])),
                                                 _mm256_maddubs_epi16(w[3], _mm256_set1_epi32(x4[3])));
                    const int32_t hx = xr->h[(r0 + r) * nb + xb], sx = half ? xr->t[(r0 + r) * nb + xb] - hx : hx;
                    L[half][r] = _mm256_sub_epi32(_mm256_add_epi32(_mm256_madd_epi16(a, ones), _mm256_madd_epi16(e, ones)),
                                                  _mm256_set1_epi32(32 * sx));
                }
            }
            const __m256 S0 = _mm256_mul_ps(D, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                                  _mm_loadl_epi64((const __m128i *)(s8 + TQ_Q6X8_SC + 8 * (2 * c))))));
            const __m256 S1 = _mm256_mul_ps(D, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                                  _mm_loadl_epi64((const __m128i *)(s8 + TQ_Q6X8_SC + 8 * (2 * c + 1))))));
            for (int r = 0; r < N; r++) {
                const __m256 dx = _mm256_set1_ps(xr->d[(r0 + r) * nb + xb]);
                acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(S0, dx), _mm256_cvtepi32_ps(L[0][r]), acc[r]);
                acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(S1, dx), _mm256_cvtepi32_ps(L[1][r]), acc[r]);
            }
        }
    }
    q8x8_store(N, acc, ms, bias, y + r0 * ldy, ldy);
}

static inline __attribute__((always_inline)) void q8x8_rows(int kind, int N, const q8_rows *xr, int64_t r0,
                                                            int64_t inner, const uint8_t *p, const float *bias,
                                                            float *y, int64_t ldy) {
#ifdef TQ_Q8X8_512
    if (kind == TQ_Q4_K) q8x8_q4_k_rows512(N, xr, r0, inner, p, bias, y, ldy);
#else
    if (kind == TQ_Q4_K) q8x8_q4_k_rows(N, xr, r0, inner, p, bias, y, ldy);
#endif
    else if (kind == TQ_Q5_K) q8x8_q5_k_rows(N, xr, r0, inner, p, bias, y, ldy);
    else if (kind == TQ_Q6_K) q8x8_q6_k_rows(N, xr, r0, inner, p, bias, y, ldy);
    else q8x8_legacy_rows(kind, N, xr, r0, inner, p, bias, y, ldy);
}

/* Rows r0..r1-1 of x against group g, in passes of up to ROWS_X8 rows (each pass size a constant). */
#define Q8X8_GROUP_FN(KIND)                                                                                     \
    static __attribute__((noinline)) void q8x8_group_##KIND(const q8_rows *xr, int64_t r0, int64_t r1,           \
                                                            int64_t inner, const uint8_t *p, const float *bias,    \
                                                            float *y, int64_t ldy) {                              \
        for (; r0 + 4 <= r1; r0 += 4) q8x8_rows(KIND, 4, xr, r0, inner, p, bias, y, ldy);                       \
        switch (r1 - r0) {                                                                                      \
        case 3: q8x8_rows(KIND, 3, xr, r0, inner, p, bias, y, ldy); break;                                      \
        case 2: q8x8_rows(KIND, 2, xr, r0, inner, p, bias, y, ldy); break;                                      \
        case 1: q8x8_rows(KIND, 1, xr, r0, inner, p, bias, y, ldy); break;                                      \
        }                                                                                                       \
    }
Q8X8_GROUP_FN(TQ_Q4_0) Q8X8_GROUP_FN(TQ_Q4_1) Q8X8_GROUP_FN(TQ_Q5_0) Q8X8_GROUP_FN(TQ_Q8_0) Q8X8_GROUP_FN(TQ_Q4_K) Q8X8_GROUP_FN(TQ_Q5_K) Q8X8_GROUP_FN(TQ_Q6_K)

typedef void (*q8x8_group_fn)(const q8_rows *, int64_t, int64_t, int64_t, const uint8_t *, const float *, float *,
                              int64_t);

/* Rows of x a tile: a wide input (a prefill chunk) runs tile by tile through all groups, so that its rounded
   rows stay in L2 while every group passes over them (256 rows of 1 536 values: 393 KB, not 49 KB). */
#define Q8X8_ROW_TILE 32

static q8x8_group_fn q8x8_group_of(int kind) {
    return kind == TQ_Q4_0 ? q8x8_group_TQ_Q4_0 : kind == TQ_Q4_1 ? q8x8_group_TQ_Q4_1
         : kind == TQ_Q5_0 ? q8x8_group_TQ_Q5_0
         : kind == TQ_Q8_0 ? q8x8_group_TQ_Q8_0 : kind == TQ_Q4_K ? q8x8_group_TQ_Q4_K
         : kind == TQ_Q5_K ? q8x8_group_TQ_Q5_K : kind == TQ_Q6_K ? q8x8_group_TQ_Q6_K : 0;
}

#ifdef TQ_GEMM_Q8X8_NAME   /* the entry points (gemm_q8x8_avx512vnni.c takes only the group kernels) */
/* y = x W^T (+ bias) with W [out, inner] in the x8 layout at p (out a multiple of 8). 0, or -1. */
int TQ_GEMM_Q8X8_NAME(int kind, const float *x, int64_t n, int64_t inner, const uint8_t *p, int64_t out,
                      const float *bias, float *y, int64_t ldy, int threads) {
    const q8x8_group_fn fn = q8x8_group_of(kind);
    if (!fn || out % 8 || inner % 32 || !tq_gemm_shape_ok(kind, inner)) return -1;
    const q8_rows xr = q8_quantize(x, n, inner, threads);
    if (!xr.mem) return -1;
    const int64_t gb = inner / 32 * tq_q8x8_chunk_bytes(kind);
#pragma omp parallel num_threads(threads)
    for (int64_t t0 = 0; t0 < n; t0 += Q8X8_ROW_TILE) {
        const int64_t t1 = n - t0 < Q8X8_ROW_TILE ? n : t0 + Q8X8_ROW_TILE;
#pragma omp for schedule(static)
        for (int64_t g = 0; g < out / 8; g++) fn(&xr, t0, t1, inner, p + g * gb, bias ? bias + 8 * g : 0, y + 8 * g, ldy);
    }
    free(xr.mem);
    return 0;
}

/* Several x8 weights on one input, side by side (as tq_gemm_parts_q8_<isa>), x rounded once. */
int TQ_GEMM_PARTS_Q8X8_NAME(int parts, const int *kinds, const uint8_t *const *ps, const int64_t *outs,
                            const float *x, int64_t n, int64_t inner, float *y, int64_t ldy, int threads) {
    enum { MAX_PARTS = 8 };
    q8x8_group_fn fns[MAX_PARTS];
    int64_t starts[MAX_PARTS + 1], cols[MAX_PARTS + 1];    /* groups, columns before each part */
    if (parts < 1 || parts > MAX_PARTS || inner % 32) return -1;
    starts[0] = cols[0] = 0;
    for (int i = 0; i < parts; i++) {
        fns[i] = q8x8_group_of(kinds[i]);
        if (!fns[i] || outs[i] % 8 || !tq_gemm_shape_ok(kinds[i], inner)) return -1;
        starts[i + 1] = starts[i] + outs[i] / 8;
        cols[i + 1] = cols[i] + outs[i];
    }
    const q8_rows xr = q8_quantize(x, n, inner, threads);
    if (!xr.mem) return -1;
#pragma omp parallel num_threads(threads)
    for (int64_t t0 = 0; t0 < n; t0 += Q8X8_ROW_TILE) {
        const int64_t t1 = n - t0 < Q8X8_ROW_TILE ? n : t0 + Q8X8_ROW_TILE;
#pragma omp for schedule(static)
        for (int64_t u = 0; u < starts[parts]; u++) {
            int i = 0;
            while (u >= starts[i + 1]) i++;
            const int64_t g = u - starts[i];
            fns[i](&xr, t0, t1, inner, ps[i] + g * (inner / 32 * tq_q8x8_chunk_bytes(kinds[i])), 0, y + cols[i] + 8 * g, ldy);
        }
    }
    free(xr.mem);
    return 0;
}
#endif
