/* Attention and exp/tanh glue, AVX-512 (F/BW/VL, FMA): ops_simd.h over simd_avx512.h. */
#include "simd_avx512.h"
#define TQ_SUFFIX(name) name##_avx512
#include "ops_simd.h"
