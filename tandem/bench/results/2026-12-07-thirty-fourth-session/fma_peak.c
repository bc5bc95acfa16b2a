/* The fp32 FMA rate of one core: 12 independent FMA chains held in registers (no memory in the loop),
   best of 5 runs of 200 M FMAs, 512-bit then 256-bit. gcc -O2 -march=native fma_peak.c */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
#define CHAINS(T, F, A, B, C)                                                                              \
    A##0 = F(A##0, B, C); A##1 = F(A##1, B, C); A##2 = F(A##2, B, C); A##3 = F(A##3, B, C);               \
    A##4 = F(A##4, B, C); A##5 = F(A##5, B, C); A##6 = F(A##6, B, C); A##7 = F(A##7, B, C);               \
    A##8 = F(A##8, B, C); A##9 = F(A##9, B, C); A##10 = F(A##10, B, C); A##11 = F(A##11, B, C);
int main(void) {
    const long iters = 200000000 / 12;
    double best = 0;
    __m512 b = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
#define V512(k) _mm512_set1_ps(1.0f + (k) * 1e-3f)   /* distinct chains: no common subexpression to fold */
    __m512 a0 = V512(0), a1 = V512(1), a2 = V512(2), a3 = V512(3), a4 = V512(4), a5 = V512(5), a6 = V512(6),
           a7 = V512(7), a8 = V512(8), a9 = V512(9), a10 = V512(10), a11 = V512(11);
    for (int rep = 0; rep < 5; rep++) {
        double t0 = now();
        for (long i = 0; i < iters; i++) { CHAINS(__m512, _mm512_fmadd_ps, a, b, c) }
        double gf = iters * 12.0 * 32 / (now() - t0) / 1e9;
        if (gf > best) best = gf;
    }
    __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                             _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(_mm512_add_ps(a6, a7),
                             _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)))));
    printf("512-bit %.1f GFLOP/s (sink %g); ", best, _mm512_reduce_add_ps(s));
    best = 0;
    __m256 e = _mm256_set1_ps(0.999999f), f = _mm256_set1_ps(1e-7f);
#define V256(k) _mm256_set1_ps(1.0f + (k) * 1e-3f)
    __m256 d0 = V256(0), d1 = V256(1), d2 = V256(2), d3 = V256(3), d4 = V256(4), d5 = V256(5), d6 = V256(6),
           d7 = V256(7), d8 = V256(8), d9 = V256(9), d10 = V256(10), d11 = V256(11);
    for (int rep = 0; rep < 5; rep++) {
        double t0 = now();
        for (long i = 0; i < iters; i++) { CHAINS(__m256, _mm256_fmadd_ps, d, e, f) }
        double gf = iters * 12.0 * 16 / (now() - t0) / 1e9;
        if (gf > best) best = gf;
    }
    __m256 u = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(d0, d1), _mm256_add_ps(d2, d3)),
                             _mm256_add_ps(_mm256_add_ps(d4, d5), _mm256_add_ps(_mm256_add_ps(d6, d7),
                             _mm256_add_ps(_mm256_add_ps(d8, d9), _mm256_add_ps(d10, d11)))));
    float v[8];
    _mm256_storeu_ps(v, u);
    printf("256-bit %.1f GFLOP/s (sink %g)\n", best, v[0]);
    return 0;
}
