/* The int8 GEMM on the x8 layout, with its ISA chosen per weight type and row count (verifier_service/x8_pick.py
   measures the choice at load).

   Every x86 path's x8 kernel computes the same bits: the per-chunk integers are exact and the conversions and
   FMAs that follow run in one order on every path (gemm_q8x8_x86.h, gemm_q8x8_avx512vnni.c;
   tests/unit/test_quant_kernels.py). So which path runs a call changes only its speed, and a row's result
   still does not depend on the block width: a plain step may run on one path and a verify block on another.
   Which is fastest does depend on the CPU: on Zen 4, whose 512-bit instructions take two passes, the 256-bit
   avx2 kernel is faster for one row and the VNNI kernel for eight (BENCHMARKS.md).

   The table is the process's: ``tq_q8x8_pick`` fills it before the first call (every entry, with the ISA the
   CPU's flags name), and again after the measurement. Row counts 1..TQ_PICK_ROWS - 1 have their own entry;
   wider calls take entry 0. A side-by-side call (several parts) takes its first part's type's entry. */
#include <stdint.h>
#include <stddef.h>

#define TQ_PICK_KINDS 64
#define TQ_PICK_ROWS 33

typedef int (*x8_one_fn)(int, const float *, int64_t, int64_t, const uint8_t *, int64_t, const float *, float *,
                         int64_t, int);
typedef int (*x8_parts_fn)(int, const int *, const uint8_t *const *, const int64_t *, const float *, int64_t,
                           int64_t, float *, int64_t, int);

static x8_one_fn one_at[TQ_PICK_KINDS][TQ_PICK_ROWS];
static x8_parts_fn parts_at[TQ_PICK_KINDS][TQ_PICK_ROWS];

/* Entry (kind, rows) runs `one` and `parts` (rows 0: every row count from TQ_PICK_ROWS on). 0, or -1. */
int tq_q8x8_pick(int kind, int64_t rows, void *one, void *parts) {
    if (kind < 0 || kind >= TQ_PICK_KINDS || rows < 0 || rows >= TQ_PICK_ROWS || !one || !parts) return -1;
    one_at[kind][rows] = (x8_one_fn)one;
    parts_at[kind][rows] = (x8_parts_fn)parts;
    return 0;
}

static inline int64_t slot(int64_t n) { return n > 0 && n < TQ_PICK_ROWS ? n : 0; }

int tq_gemm_q8x8_picked(int kind, const float *x, int64_t n, int64_t inner, const uint8_t *p, int64_t out,
                        const float *bias, float *y, int64_t ldy, int threads) {
    if (kind < 0 || kind >= TQ_PICK_KINDS) return -1;
    const x8_one_fn fn = one_at[kind][slot(n)];
    return fn ? fn(kind, x, n, inner, p, out, bias, y, ldy, threads) : -1;
}

int tq_gemm_parts_q8x8_picked(int parts, const int *kinds, const uint8_t *const *ps, const int64_t *outs,
                              const float *x, int64_t n, int64_t inner, float *y, int64_t ldy, int threads) {
    if (parts < 1 || kinds[0] < 0 || kinds[0] >= TQ_PICK_KINDS) return -1;
    const x8_parts_fn fn = parts_at[kinds[0]][slot(n)];
    return fn ? fn(parts, kinds, ps, outs, x, n, inner, y, ldy, threads) : -1;
}
