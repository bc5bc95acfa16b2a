/* The int8-activation GEMM (gemm_q8.h) on the avx512 path: gemm_q8_x86.h's 256-bit code built with this
   path's flags, and gemm_q8x8_x86.h's with Q4_K's loop on 512-bit registers (TQ_Q8X8_512): the same integer
   sums and FMAs, so both x86 paths give the same bits. */
#include "gemm_q8_x86.h"

#define TQ_GEMM_Q8_NAME tq_gemm_q8_avx512
#define TQ_GEMM_PARTS_Q8_NAME tq_gemm_parts_q8_avx512
#include "gemm_q8_dispatch.h"

#define TQ_GEMM_Q8X8_NAME tq_gemm_q8x8_avx512
#define TQ_GEMM_PARTS_Q8X8_NAME tq_gemm_parts_q8x8_avx512
#define TQ_Q8X8_512 1
#include "gemm_q8x8_x86.h"
