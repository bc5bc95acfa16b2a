/* The x8 int8 GEMM (gemm_q8x8_x86.h) with AVX-512 VNNI, two weight groups a register: the avx512 path's x8
   entry points on CPUs with avx512_vnni (Zen 4/5, Intel since Ice Lake; native.py chooses at run time).

   Two groups g, g + 1 (16 weight rows, 16 consecutive outputs) side by side in one 512-bit register: the
   low half holds group g's 32-byte lane, the high half group g + 1's. vpdpbusd multiplies each row's 4
   unsigned weight bytes by x's 4 signed bytes (one dword of x, broadcast from memory) and adds the 4
   products into the row's int32: one instruction for what vpmaddubsw + vpaddw (+ vpmaddwd) did, over twice
   the rows. The per-chunk integers are exact either way (no int16 stage here, nothing saturates: at most
   32 * 255 * 127 per chunk), so each chunk's L is the integer gemm_q8.h defines, and the conversions and
   FMAs that follow are gemm_q8x8_x86.h's, element by element: y is bit-identical to the 256-bit x8 kernel,
   the per-row kernel and gemm_q8_generic.c (tests/unit/test_quant_kernels.py).

   Weights go in unsigned: Q4_0 (q - 8) and Q5_0 (q - 16) as in gemm_q8x8_x86.h (sum (q - c) x = sum q x - c
   sum x, sum x = q8_rows.t); Q8_0's signed bytes with their sign bit flipped (w + 128), then - 128 sum x;
   Q6_K's q (0..63), then - 32 times each half's sum (q8_rows.h, t - h). An odd last group runs
   gemm_q8x8_x86.h's 8-row code (the same bits). */
#include "gemm_q8_x86.h"
#include "gemm_q8_dispatch.h"      /* q8_quantize */
#define TQ_Q8X8_512 1
#include "gemm_q8x8_x86.h"        /* the 8-row group kernels */

#define ROWS_V 8

/* Independent int32 sums a row keeps within a chunk (added up, exactly, at its end): vpdpbusd's latency is
   several cycles, so one running sum a row would leave a pass of one or two rows waiting on it. */
#define V_ACCS(N) ((N) == 1 ? 8 : (N) == 2 ? 4 : (N) <= 4 ? 2 : 1)

/* The row's V_ACCS(N) sums of a chunk, added up. */
static inline __attribute__((always_inline)) __m512i v_sum(int A, const __m512i *a) {
    __m512i s = a[0];
    for (int i = 1; i < A; i++) s = _mm512_add_epi32(s, a[i]);
    return s;
}

/* 32 bytes at a (group g) and at a + gb (group g + 1) in one register. */
static inline __attribute__((always_inline)) __m512i v_ld2(const uint8_t *a, int64_t gb) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a)),
                              _mm256_loadu_si256((const __m256i *)(a + gb)), 1);
}

/* 8 fp16 at a and 8 at a + gb as 16 floats. */
static inline __attribute__((always_inline)) __m512 v_ph2(const uint8_t *a, int64_t gb) {
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)a)),
                                                   _mm_loadu_si128((const __m128i *)(a + gb)), 1));
}

/* 8 bytes at a and 8 at a + gb, widened to 16 int32 (unsigned or signed). */
static inline __attribute__((always_inline)) __m512i v_u8x2(const uint8_t *a, int64_t gb) {
    return _mm512_cvtepu8_epi32(_mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)a),
                                                   _mm_loadl_epi64((const __m128i *)(a + gb))));
}
static inline __attribute__((always_inline)) __m512i v_i8x2(const uint8_t *a, int64_t gb) {
    return _mm512_cvtepi8_epi32(_mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)a),
                                                   _mm_loadl_epi64((const __m128i *)(a + gb))));
}

/* The same bytes of the next pair of groups (a, a + gb: group g's; the next pair's start 2 gb on), into L1
   ahead of use. Read alone, each group of a pair is a short stream (a few KB) that the hardware prefetcher
   starts anew every pair; the one-group kernel reads the weight as one long stream and needs none. */
static inline __attribute__((always_inline)) void v_prefetch_next(const uint8_t *a, int64_t gb, int64_t bytes) {
    for (int64_t o = 0; o < bytes; o += 64) {
        _mm_prefetch((const char *)(a + 2 * gb + o), _MM_HINT_T0);
        _mm_prefetch((const char *)(a + 3 * gb + o), _MM_HINT_T0);
    }
}

/* x's dword l of block xb of row r, broadcast (a memory operand of vpdpbusd). */
#define XD(r, xb, l) _mm512_set1_epi32(((const int32_t *)(xr->q + (r0 + (r)) * inner + 32 * (xb)))[l])

static inline __attribute__((always_inline)) void v_store(int N, const __m512 *acc, const __m512 *ms,
                                                          const float *bias, float *y, int64_t ldy) {
    const __m512 b = bias ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
    for (int r = 0; r < N; r++) _mm512_storeu_ps(y + r * ldy, _mm512_add_ps(_mm512_add_ps(acc[r], ms[r]), b));
}

/* Q4_0, Q4_1, Q5_0, Q8_0: rows r0..r0+N-1 of x against groups g, g + 1 (p: group g's first byte, gb: the
   bytes of a group). */
static inline __attribute__((always_inline)) void v_legacy_rows(int kind, int N, const q8_rows *xr, int64_t r0,
                                                                int64_t inner, const uint8_t *p, int64_t gb,
                                                                const float *bias, float *y, int64_t ldy) {
    const int64_t nb = inner / 32, cb = tq_q8x8_chunk_bytes(kind);
    const int qs_at = tq_q8x8_qs_offset(kind), A = V_ACCS(N);
    const __m512i nib = _mm512_set1_epi8(0x0F), flip = _mm512_set1_epi8((char)0x80);
    __m512 acc[ROWS_V], ms[ROWS_V];
    for (int r = 0; r < N; r++) acc[r] = ms[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *c8 = p + b * cb;
        v_prefetch_next(c8, gb, cb);
        __m512i L[ROWS_V], P[ROWS_V][8];
        for (int r = 0; r < N; r++)
            for (int a = 0; a < A; a++) P[r][a] = _mm512_setzero_si512();
        if (kind == TQ_Q8_0) {
            for (int l = 0; l < 8; l++) {
                const __m512i w = _mm512_xor_si512(v_ld2(c8 + qs_at + 32 * l, gb), flip);
                for (int r = 0; r < N; r++) P[r][l % A] = _mm512_dpbusd_epi32(P[r][l % A], w, XD(r, b, l));
            }
            for (int r = 0; r < N; r++)
                L[r] = _mm512_sub_epi32(v_sum(A, P[r]), _mm512_set1_epi32(128 * xr->t[(r0 + r) * nb + b]));
        } else {
            __m512i QH = _mm512_setzero_si512(), five = _mm512_set1_epi8(0x10), dw = _mm512_setzero_si512();
            if (kind == TQ_Q5_0) {
                QH = v_ld2(c8 + 16, gb);
                dw = _mm512_broadcast_i64x4(_mm256_setr_epi8(0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12,
                                                             0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12));
            }
            for (int l = 0; l < 4; l++) {
                const __m512i q = v_ld2(c8 + qs_at + 32 * l, gb);
                __m512i lo = _mm512_and_si512(q, nib), hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), nib);
                if (kind == TQ_Q5_0) {   /* gemm_q8x8_x86.h's fifth bits: lane l's bits of each row's qh, to 0x10 */
                    const __m512i sel = _mm512_set1_epi32((int)(0x08040201u << (4 * (l % 2))));
                    const __m512i flo = _mm512_shuffle_epi8(QH, _mm512_add_epi8(dw, _mm512_set1_epi32(0x01010101 * (l / 2))));
                    const __m512i fhi = _mm512_shuffle_epi8(QH, _mm512_add_epi8(dw, _mm512_set1_epi32(0x01010101 * (2 + l / 2))));
                    lo = _mm512_or_si512(lo, _mm512_maskz_mov_epi8(_mm512_test_epi8_mask(flo, sel), five));
                    hi = _mm512_or_si512(hi, _mm512_maskz_mov_epi8(_mm512_test_epi8_mask(fhi, sel), five));
                }
                for (int r = 0; r < N; r++) {
                    P[r][(2 * l) % A] = _mm512_dpbusd_epi32(P[r][(2 * l) % A], lo, XD(r, b, l));
                    P[r][(2 * l + 1) % A] = _mm512_dpbusd_epi32(P[r][(2 * l + 1) % A], hi, XD(r, b, l + 4));
                }
            }
            const int c = kind == TQ_Q4_0 ? 8 : kind == TQ_Q5_0 ? 16 : 0;
            for (int r = 0; r < N; r++)
                L[r] = c ? _mm512_sub_epi32(v_sum(A, P[r]), _mm512_set1_epi32(c * xr->t[(r0 + r) * nb + b])) : v_sum(A, P[r]);
        }
        const __m512 D = v_ph2(c8, gb);
        for (int r = 0; r < N; r++)
            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(D, _mm512_set1_ps(xr->d[(r0 + r) * nb + b])),
                                     _mm512_cvtepi32_ps(L[r]), acc[r]);
        if (kind == TQ_Q4_1) {
            const __m512 M = v_ph2(c8 + 16, gb);
            for (int r = 0; r < N; r++) ms[r] = _mm512_fmadd_ps(M, _mm512_set1_ps(xr->s[(r0 + r) * nb + b]), ms[r]);
        }
    }
    v_store(N, acc, ms, bias, y + r0 * ldy, ldy);
}

/* Q4_K and Q5_K: gemm_q8x8_x86.h's q8x8_q4_k_rows and q8x8_q5_k_rows over two groups (Q5_K: each lane's
   fifth bits, bit c of its qh bytes for chunk c, moved to 0x10). */
static inline __attribute__((always_inline)) void v_k4_rows(int kind, int N, const q8_rows *xr, int64_t r0,
                                                            int64_t inner, const uint8_t *p, int64_t gb,
                                                            const float *bias, float *y, int64_t ldy) {
    const int64_t nb = inner / 32, sb = 8 * tq_q8x8_chunk_bytes(kind);
    const int A = N > 2 ? 1 : V_ACCS(N);       /* 2 sums a row at 3-4 rows spilled here (Q5_K w4: 2.2x slower) */
    const __m512i nib = _mm512_set1_epi8(0x0F), one = _mm512_set1_epi8(0x01);
    __m512 acc[ROWS_V], ms[ROWS_V];
    for (int r = 0; r < N; r++) acc[r] = ms[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < inner / QK_K; b++) {
        const uint8_t *s8 = p + b * sb;
        v_prefetch_next(s8, gb, sb);
        const __m512 DM = v_ph2(s8 + 16, gb);
        for (int k = 0; k < 8; k++) {
            const __m512 m = _mm512_mul_ps(DM, _mm512_cvtepi32_ps(v_u8x2(s8 + TQ_K4X8_M + 8 * k, gb)));
            const __m512 neg = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(m), _mm512_set1_epi32((int)0x80000000u)));
            for (int r = 0; r < N; r++) ms[r] = _mm512_fmadd_ps(neg, _mm512_set1_ps(xr->s[(r0 + r) * nb + 8 * b + k]), ms[r]);
        }
        const __m512 D = v_ph2(s8, gb);
        for (int c = 0; c < 8; c++) {
            const __m512 SC = _mm512_mul_ps(D, _mm512_cvtepi32_ps(v_u8x2(s8 + TQ_K4X8_SC + 8 * c, gb)));
            const int64_t xb = 8 * b + c;
            __m512i P[ROWS_V][8];
            for (int r = 0; r < N; r++)
                for (int a = 0; a < A; a++) P[r][a] = _mm512_setzero_si512();
            for (int l = 0; l < 8; l++) {
                const __m512i q = v_ld2(s8 + tq_k4x8_qs_offset(kind) + 32 * (8 * (c / 2) + l), gb);
                __m512i w = _mm512_and_si512(c % 2 ? _mm512_srli_epi16(q, 4) : q, nib);
                if (kind == TQ_Q5_K) {
                    const __m512i h = _mm512_and_si512(_mm512_srl_epi16(v_ld2(s8 + TQ_K5X8_QH + 32 * l, gb),
                                                                        _mm_cvtsi32_si128(c)), one);
                    w = _mm512_or_si512(w, _mm512_slli_epi16(h, 4));
                }
                for (int r = 0; r < N; r++) P[r][l % A] = _mm512_dpbusd_epi32(P[r][l % A], w, XD(r, xb, l));
            }
            for (int r = 0; r < N; r++)
                acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(SC, _mm512_set1_ps(xr->d[(r0 + r) * nb + xb])),
                                         _mm512_cvtepi32_ps(v_sum(A, P[r])), acc[r]);
        }
    }
    v_store(N, acc, ms, bias, y + r0 * ldy, ldy);
}

/* Q6_K: gemm_q8x8_x86.h's q8x8_q6_k_rows over two groups. */
static inline __attribute__((always_inline)) void v_q6_k_rows(int N, const q8_rows *xr, int64_t r0, int64_t inner,
                                                              const uint8_t *p, int64_t gb, const float *bias,
                                                              float *y, int64_t ldy) {
    const int64_t nb = inner / 32, sb = 8 * tq_q8x8_chunk_bytes(TQ_Q6_K);
    const int A = V_ACCS(N) < 4 ? V_ACCS(N) : 4;
    const __m512i nib = _mm512_set1_epi8(0x0F), top = _mm512_set1_epi8(0x30);
    __m512 acc[ROWS_V], ms[ROWS_V];
    for (int r = 0; r < N; r++) acc[r] = ms[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < inner / QK_K; b++) {
        const uint8_t *s8 = p + b * sb;
        v_prefetch_next(s8, gb, sb);
        const __m512 D = v_ph2(s8, gb);
        for (int c = 0; c < 8; c++) {
            const int h = c / 4, t = c % 4;
            const uint8_t *ql = s8 + TQ_Q6X8_QL + 32 * 8 * (2 * h + t % 2), *qh = s8 + TQ_Q6X8_QH + 32 * 8 * h;
            const __m128i lsh = _mm_cvtsi32_si128(4 * (t / 2)), up = _mm_cvtsi32_si128(t < 3 ? 4 - 2 * t : 0),
                          down = _mm_cvtsi32_si128(t == 3 ? 2 : 0);
            const int64_t xb = 8 * b + c;
            __m512i L[2][ROWS_V];
            for (int half = 0; half < 2; half++) {
                __m512i P[ROWS_V][4];
                for (int r = 0; r < N; r++)
                    for (int a = 0; a < A; a++) P[r][a] = _mm512_setzero_si512();
                for (int i = 0; i < 4; i++) {
                    const int l = 4 * half + i;
                    const __m512i lo = _mm512_and_si512(_mm512_srl_epi16(v_ld2(ql + 32 * l, gb), lsh), nib);
                    const __m512i u = v_ld2(qh + 32 * l, gb);
                    const __m512i w = _mm512_or_si512(lo, _mm512_and_si512(_mm512_srl_epi16(_mm512_sll_epi16(u, up), down), top));
                    for (int r = 0; r < N; r++) P[r][i % A] = _mm512_dpbusd_epi32(P[r][i % A], w, XD(r, xb, l));
                }
                for (int r = 0; r < N; r++) {
                    const int32_t hx = xr->h[(r0 + r) * nb + xb], sx = half ? xr->t[(r0 + r) * nb + xb] - hx : hx;
                    L[half][r] = _mm512_sub_epi32(v_sum(A, P[r]), _mm512_set1_epi32(32 * sx));
                }
            }
            const __m512 S0 = _mm512_mul_ps(D, _mm512_cvtepi32_ps(v_i8x2(s8 + TQ_Q6X8_SC + 8 * (2 * c), gb)));
            const __m512 S1 = _mm512_mul_ps(D, _mm512_cvtepi32_ps(v_i8x2(s8 + TQ_Q6X8_SC + 8 * (2 * c + 1), gb)));
            for (int r = 0; r < N; r++) {
                const __m512 dx = _mm512_set1_ps(xr->d[(r0 + r) * nb + xb]);
                acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(S0, dx), _mm512_cvtepi32_ps(L[0][r]), acc[r]);
                acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(S1, dx), _mm512_cvtepi32_ps(L[1][r]), acc[r]);
            }
        }
    }
    v_store(N, acc, ms, bias, y + r0 * ldy, ldy);
}

static inline __attribute__((always_inline)) void v_rows(int kind, int N, const q8_rows *xr, int64_t r0, int64_t inner,
                                                         const uint8_t *p, int64_t gb, const float *bias, float *y,
                                                         int64_t ldy) {
    if (kind == TQ_Q4_K || kind == TQ_Q5_K) v_k4_rows(kind, N, xr, r0, inner, p, gb, bias, y, ldy);
    else if (kind == TQ_Q6_K) v_q6_k_rows(N, xr, r0, inner, p, gb, bias, y, ldy);
    else v_legacy_rows(kind, N, xr, r0, inner, p, gb, bias, y, ldy);
}

/* Rows r0..r1-1 of x against groups g, g + 1, in passes of up to ROWS_V rows. */
#define V_PAIR_FN(KIND)                                                                                         \
    static __attribute__((noinline)) void v_pair_##KIND(const q8_rows *xr, int64_t r0, int64_t r1, int64_t inner, \
                                                        const uint8_t *p, int64_t gb, const float *bias, float *y, \
                                                        int64_t ldy) {                                            \
        if (((KIND) == TQ_Q8_0 || (KIND) == TQ_Q4_K) && r1 - r0 == 1) {   /* one row: the 8-row code was faster (Zen 5) */\
            q8x8_group_##KIND(xr, r0, r1, inner, p, bias, y, ldy);                                              \
            q8x8_group_##KIND(xr, r0, r1, inner, p + gb, bias ? bias + 8 : 0, y + 8, ldy);                      \
            return;                                                                                             \
        }                                                                                                       \
        for (; r0 + 8 <= r1; r0 += 8) v_rows(KIND, 8, xr, r0, inner, p, gb, bias, y, ldy);                        \
        switch (r1 - r0) {                                                                                      \
        case 7: v_rows(KIND, 7, xr, r0, inner, p, gb, bias, y, ldy); break;                                     \
        case 6: v_rows(KIND, 6, xr, r0, inner, p, gb, bias, y, ldy); break;                                     \
        case 5: v_rows(KIND, 5, xr, r0, inner, p, gb, bias, y, ldy); break;                                     \
        case 4: v_rows(KIND, 4, xr, r0, inner, p, gb, bias, y, ldy); break;                                     \
        case 3: v_rows(KIND, 3, xr, r0, inner, p, gb, bias, y, ldy); break;                                     \
        case 2: v_rows(KIND, 2, xr, r0, inner, p, gb, bias, y, ldy); break;                                     \
        case 1: v_rows(KIND, 1, xr, r0, inner, p, gb, bias, y, ldy); break;                                     \
        }                                                                                                       \
    }
V_PAIR_FN(TQ_Q4_0) V_PAIR_FN(TQ_Q4_1) V_PAIR_FN(TQ_Q5_0) V_PAIR_FN(TQ_Q8_0) V_PAIR_FN(TQ_Q4_K) V_PAIR_FN(TQ_Q5_K) V_PAIR_FN(TQ_Q6_K)

typedef void (*v_pair_fn)(const q8_rows *, int64_t, int64_t, int64_t, const uint8_t *, int64_t, const float *,
                          float *, int64_t);

static v_pair_fn v_pair_of(int kind) {
    return kind == TQ_Q4_0 ? v_pair_TQ_Q4_0 : kind == TQ_Q4_1 ? v_pair_TQ_Q4_1 : kind == TQ_Q5_0 ? v_pair_TQ_Q5_0
         : kind == TQ_Q8_0 ? v_pair_TQ_Q8_0 : kind == TQ_Q4_K ? v_pair_TQ_Q4_K : kind == TQ_Q5_K ? v_pair_TQ_Q5_K
         : kind == TQ_Q6_K ? v_pair_TQ_Q6_K : 0;
}

/* One weight's work as units: unit u < pairs is groups 2u, 2u + 1; the unit after them (odd group count, or
   every group of a kind without a pair kernel) runs gemm_q8x8_x86.h's 8-row code. */
typedef struct {
    v_pair_fn pair;
    q8x8_group_fn group;
    const uint8_t *p;
    int64_t gb, groups, pairs, units, col;
    const float *bias;
} v_weight;

static int v_weight_init(v_weight *w, int kind, const uint8_t *p, int64_t out, int64_t inner, const float *bias,
                         int64_t col) {
    w->group = q8x8_group_of(kind);
    if (!w->group || out % 8 || inner % 32 || !tq_gemm_shape_ok(kind, inner)) return -1;
    w->pair = v_pair_of(kind);
    w->p = p;
    w->gb = inner / 32 * tq_q8x8_chunk_bytes(kind);
    w->groups = out / 8;
    w->pairs = w->pair ? w->groups / 2 : 0;
    w->units = w->pairs + (w->groups - 2 * w->pairs);
    w->bias = bias;
    w->col = col;
    return 0;
}

static inline void v_unit(const v_weight *w, int64_t u, const q8_rows *xr, int64_t t0, int64_t t1, int64_t inner,
                          float *y, int64_t ldy) {
    if (u < w->pairs) {
        const int64_t g = 2 * u;
        w->pair(xr, t0, t1, inner, w->p + g * w->gb, w->gb, w->bias ? w->bias + 8 * g : 0, y + w->col + 8 * g, ldy);
    } else {
        const int64_t g = 2 * w->pairs + (u - w->pairs);
        w->group(xr, t0, t1, inner, w->p + g * w->gb, w->bias ? w->bias + 8 * g : 0, y + w->col + 8 * g, ldy);
    }
}

int tq_gemm_q8x8_avx512vnni(int kind, const float *x, int64_t n, int64_t inner, const uint8_t *p, int64_t out,
                            const float *bias, float *y, int64_t ldy, int threads) {
    v_weight w;
    if (v_weight_init(&w, kind, p, out, inner, bias, 0)) return -1;
    const q8_rows xr = q8_quantize(x, n, inner, threads);
    if (!xr.mem) return -1;
#pragma omp parallel num_threads(threads)
    for (int64_t t0 = 0; t0 < n; t0 += Q8X8_ROW_TILE) {
        const int64_t t1 = n - t0 < Q8X8_ROW_TILE ? n : t0 + Q8X8_ROW_TILE;
#pragma omp for schedule(static)
        for (int64_t u = 0; u < w.units; u++) v_unit(&w, u, &xr, t0, t1, inner, y, ldy);
    }
    free(xr.mem);
    return 0;
}

int tq_gemm_parts_q8x8_avx512vnni(int parts, const int *kinds, const uint8_t *const *ps, const int64_t *outs,
                                  const float *x, int64_t n, int64_t inner, float *y, int64_t ldy, int threads) {
    enum { MAX_PARTS = 8 };
    v_weight ws[MAX_PARTS];
    int64_t starts[MAX_PARTS + 1], col = 0;
    if (parts < 1 || parts > MAX_PARTS || inner % 32) return -1;
    starts[0] = 0;
    for (int i = 0; i < parts; i++) {
        if (v_weight_init(&ws[i], kinds[i], ps[i], outs[i], inner, 0, col)) return -1;
        starts[i + 1] = starts[i] + ws[i].units;
        col += outs[i];
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
            v_unit(&ws[i], u - starts[i], &xr, t0, t1, inner, y, ldy);
        }
    }
    free(xr.mem);
    return 0;
}
