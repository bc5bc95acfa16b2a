/* GEMMs on the target's GGUF blocks, read as stored (issue 14): y[r, o] = sum_i W[o, i] * x[r, i] (+ b[o]).

   W is never expanded in memory: each 32-weight block is rebuilt in registers with exactly the
   arithmetic gguf-py's dequantize uses to make the fp32 weights transformers loads (Q4_1: (d * q) + m,
   two fp32 roundings; Q8_0: q * d, one), then multiplied into fp32 accumulators. So the weights are
   bit for bit those of the model's nn.Linear; only the summation order is this kernel's (as with any
   GEMM). Reading 0.625 (Q4_1) or 1.0625 (Q8_0) bytes a weight instead of 4 moves the memory floor.

   Exact rows: every row r of x runs the same instruction sequence (its own accumulators, blocks in
   order, one fixed horizontal sum), whatever the number of rows or threads, and an output element is
   computed by one thread. A token's logits are therefore the same in a plain step and in any verify
   block: greedy speculative output equals plain decoding.

   Built at run time by verifier_service/gguf_linear.py with -ffp-contract=off (the weight rebuild
   must not be fused into an FMA: that would change its rounding) and -fopenmp, linked against the
   libgomp torch has loaded (same SONAME), so these loops share torch's OpenMP threads.

   Layouts (prepared once by gguf_linear.py): for out rows and nb = in / 32 blocks a row,
     Q4_1: d[out * nb], m[out * nb] (fp32, from fp16), qs[out * nb * 16] (byte j: element j in the low
           nibble, element j + 16 in the high nibble, as in the file)
     Q8_0: d[out * nb] (fp32, from fp16), qs[out * nb * 32] (int8)
*/
#include <immintrin.h>
#include <stdint.h>

#define ROWS 8   /* rows of x per pass over a weight row (its blocks stay in L1 between passes) */

int gguf_gemm_abi(void) { return 1; }

static inline float hsum(__m512 lo, __m512 hi) { return _mm512_reduce_add_ps(_mm512_add_ps(lo, hi)); }

enum { KIND_Q4_1, KIND_Q8_0 };

/* The 32 weights of block b of output row o, as two vectors (elements 0-15, 16-31). */
static inline __attribute__((always_inline)) void block_weights(int kind, const float *d, const float *m,
                                                                const void *qs, int64_t o, int64_t nb, int64_t b,
                                                                __m512 *wl, __m512 *wh) {
    const __m512 vd = _mm512_set1_ps(d[o * nb + b]);
    if (kind == KIND_Q4_1) {
        /* the block's 16 possible weights, (d * q) + m for q = 0..15 as gguf-py computes them; each weight
           is then a lookup (vpermps reads the low 4 bits of each index: no masking) */
        const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        const __m512 table = _mm512_add_ps(_mm512_mul_ps(vd, iota), _mm512_set1_ps(m[o * nb + b]));
        const __m128i q = _mm_loadu_si128((const __m128i *)((const uint8_t *)qs + (o * nb + b) * 16));
        *wl = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(q), table);
        *wh = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_srli_epi16(q, 4)), table);
    } else {                                                   /* q * d, as gguf-py */
        const int8_t *q = (const int8_t *)qs + (o * nb + b) * 32;
        *wl = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q))), vd);
        *wh = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + 16)))), vd);
    }
}

/* Rows r0..r0+N-1 of x against output row o. N is a constant in each instance below, so the 2 * N
   accumulators are registers and the row loop is unrolled (with a run-time row count, branches between
   the FMAs and the zeroing of all ROWS accumulators cost 10-25 % at widths 1-8, measured on the 2-core
   AMD EPYC). Each weight block, rebuilt once, serves the N rows. */
static inline __attribute__((always_inline)) void rows_times_row(int kind, int N, const float *x, int64_t in,
                                                                 const float *d, const float *m, const void *qs,
                                                                 int64_t out, int64_t nb, const float *bias,
                                                                 float *y, int64_t r0, int64_t o) {
    __m512 lo[ROWS], hi[ROWS];
    for (int r = 0; r < N; r++) { lo[r] = _mm512_setzero_ps(); hi[r] = _mm512_setzero_ps(); }
    for (int64_t b = 0; b < nb; b++) {
        __m512 wl, wh;
        block_weights(kind, d, m, qs, o, nb, b, &wl, &wh);
        for (int r = 0; r < N; r++) {
            const float *xr = x + (r0 + r) * in + b * 32;
            const __m512 xl = _mm512_loadu_ps(xr), xh = _mm512_loadu_ps(xr + 16);
            lo[r] = _mm512_fmadd_ps(wl, xl, lo[r]);
            hi[r] = _mm512_fmadd_ps(wh, xh, hi[r]);
        }
    }
    for (int r = 0; r < N; r++)
        y[(r0 + r) * out + o] = hsum(lo[r], hi[r]) + (bias ? bias[o] : 0.0f);
}

/* One function per (kind, N): each gets its own register allocation. */
typedef void (*rows_fn)(const float *, int64_t, const float *, const float *, const void *, int64_t, int64_t,
                        const float *, float *, int64_t, int64_t);
#define ROWS_FN(KIND, N)                                                                                      \
    static __attribute__((noinline)) void rows_##KIND##_##N(const float *x, int64_t in, const float *d,        \
                                                           const float *m, const void *qs, int64_t out,        \
                                                           int64_t nb, const float *bias, float *y,            \
                                                           int64_t r0, int64_t o) {                            \
        rows_times_row(KIND, N, x, in, d, m, qs, out, nb, bias, y, r0, o);                                    \
    }
#define ROWS_FNS(KIND) ROWS_FN(KIND, 1) ROWS_FN(KIND, 2) ROWS_FN(KIND, 3) ROWS_FN(KIND, 4) \
                       ROWS_FN(KIND, 5) ROWS_FN(KIND, 6) ROWS_FN(KIND, 7) ROWS_FN(KIND, 8)
ROWS_FNS(KIND_Q4_1)
ROWS_FNS(KIND_Q8_0)
#define ROWS_TABLE(KIND) {rows_##KIND##_1, rows_##KIND##_2, rows_##KIND##_3, rows_##KIND##_4, \
                          rows_##KIND##_5, rows_##KIND##_6, rows_##KIND##_7, rows_##KIND##_8}
static const rows_fn ROWS_OF[2][ROWS] = {ROWS_TABLE(KIND_Q4_1), ROWS_TABLE(KIND_Q8_0)};

static void gemm(int kind, const float *x, int64_t rows, int64_t in, const float *d, const float *m,
                 const void *qs, int64_t out, const float *bias, float *y, int threads) {
    const int64_t nb = in / 32;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t o = 0; o < out; o++)
        for (int64_t r0 = 0; r0 < rows; r0 += ROWS) {
            const int n = rows - r0 < ROWS ? (int)(rows - r0) : ROWS;
            ROWS_OF[kind][n - 1](x, in, d, m, qs, out, nb, bias, y, r0, o);
        }
}

void gguf_q4_1_gemm(const float *x, int64_t rows, int64_t in, const float *d, const float *m, const uint8_t *qs,
                    int64_t out, const float *bias, float *y, int threads) {
    gemm(KIND_Q4_1, x, rows, in, d, m, qs, out, bias, y, threads);
}

void gguf_q8_0_gemm(const float *x, int64_t rows, int64_t in, const float *d, const int8_t *qs,
                    int64_t out, const float *bias, float *y, int threads) {
    gemm(KIND_Q8_0, x, rows, in, d, NULL, qs, out, bias, y, threads);
}
