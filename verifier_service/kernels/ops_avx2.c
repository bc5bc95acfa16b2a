/* Attention and exp/tanh glue, AVX2 + FMA: ops_simd.h over simd_avx2.h. */
#include "simd_avx2.h"
#define TQ_SUFFIX(name) name##_avx2
#include "ops_simd.h"
