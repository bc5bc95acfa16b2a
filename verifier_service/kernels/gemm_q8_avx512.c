/* The int8-activation GEMM (gemm_q8.h) on the avx512 path: gemm_q8_x86.h's 256-bit code built with this
   path's flags, so both x86 paths give the same bits (a 512-bit / VNNI version is not written yet). */
#include "gemm_q8_x86.h"

#define TQ_GEMM_Q8_NAME tq_gemm_q8_avx512
#define TQ_GEMM_PARTS_Q8_NAME tq_gemm_parts_q8_avx512
#include "gemm_q8_dispatch.h"

#define TQ_GEMM_Q8X8_NAME tq_gemm_q8x8_avx512
#define TQ_GEMM_PARTS_Q8X8_NAME tq_gemm_parts_q8x8_avx512
#include "gemm_q8x8_x86.h"
