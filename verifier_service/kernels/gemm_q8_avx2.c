/* The int8-activation GEMM (gemm_q8.h), AVX2: gemm_q8_x86.h. */
#include "gemm_q8_x86.h"

#define TQ_GEMM_Q8_NAME tq_gemm_q8_avx2
#define TQ_GEMM_PARTS_Q8_NAME tq_gemm_parts_q8_avx2
#include "gemm_q8_dispatch.h"

#define TQ_GEMM_Q8X8_NAME tq_gemm_q8x8_avx2
#define TQ_GEMM_PARTS_Q8X8_NAME tq_gemm_parts_q8x8_avx2
#include "gemm_q8x8_x86.h"
