/* Attention for the rows of a plain step or a verify block, one (row, head) at a time (issue 14).

   out[i, h] = softmax(scale * q[i, h] . K[kv(h), 0..start+i]) . V[kv(h), 0..start+i]

   Row i attends to its own causal prefix of the static KV cache. Every (row, head) runs the same code
   whatever the number of rows or threads (one thread computes it), so a token's attention output is
   bit-identical in a plain step and inside any verify block: the exact-rows property of the static
   decoder without a torch call (bmm, softmax, bmm, slices) per row and layer.

   exp: simd_exp.h.
   Needs head_dim % 16 == 0 (checked by the caller). Built with gguf_gemm.c (verifier_service/native.py). */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "simd_exp.h"

int row_attention_abi(void) { return 1; }

/* q: row i, head h at q + i * q_row + h * d (heads contiguous); k, v: [kv_heads, cap, d] of one layer;
   out: [n, heads * d]. */
void row_attention(const float *q, int64_t q_row, int64_t n, int64_t heads, int64_t kv_heads, int64_t d,
                   const float *k, const float *v, int64_t cap, int64_t start, float scale, float *out, int threads) {
    const int64_t group = heads / kv_heads;
#pragma omp parallel num_threads(threads)
    {
        float *s = (float *)malloc(sizeof(float) * (size_t)(start + n + 16));
#pragma omp for schedule(static)
        for (int64_t t = 0; t < n * heads; t++) {
            const int64_t i = t / heads, h = t % heads, m = start + i + 1;
            const float *qi = q + i * q_row + h * d;
            const float *K = k + (h / group) * cap * d, *V = v + (h / group) * cap * d;
            float mx = -INFINITY;
            int64_t j = 0;
            for (; j + 4 <= m; j += 4) {          /* four keys at a time: four independent FMA chains */
                const float *k0 = K + j * d;
                __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
                for (int64_t c = 0; c < d; c += 16) {
                    const __m512 qc = _mm512_loadu_ps(qi + c);
                    a0 = _mm512_fmadd_ps(qc, _mm512_loadu_ps(k0 + c), a0);
                    a1 = _mm512_fmadd_ps(qc, _mm512_loadu_ps(k0 + d + c), a1);
                    a2 = _mm512_fmadd_ps(qc, _mm512_loadu_ps(k0 + 2 * d + c), a2);
                    a3 = _mm512_fmadd_ps(qc, _mm512_loadu_ps(k0 + 3 * d + c), a3);
                }
                s[j] = _mm512_reduce_add_ps(a0) * scale;
                s[j + 1] = _mm512_reduce_add_ps(a1) * scale;
                s[j + 2] = _mm512_reduce_add_ps(a2) * scale;
                s[j + 3] = _mm512_reduce_add_ps(a3) * scale;
            }
            for (; j < m; j++) {                  /* the same arithmetic for the last keys */
                __m512 acc = _mm512_setzero_ps();
                for (int64_t c = 0; c < d; c += 16)
                    acc = _mm512_fmadd_ps(_mm512_loadu_ps(qi + c), _mm512_loadu_ps(K + j * d + c), acc);
                s[j] = _mm512_reduce_add_ps(acc) * scale;
            }
            for (int64_t t2 = 0; t2 < m; t2++) mx = s[t2] > mx ? s[t2] : mx;
            const __m512 vmx = _mm512_set1_ps(mx);
            __m512 vsum = _mm512_setzero_ps();
            for (int64_t j = 0; j < m; j += 16) {
                const __mmask16 mask = m - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (m - j)) - 1u);
                const __m512 p = _mm512_maskz_mov_ps(mask, exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, s + j), vmx)));
                _mm512_mask_storeu_ps(s + j, mask, p);
                vsum = _mm512_add_ps(vsum, p);
            }
            const float inv = 1.0f / _mm512_reduce_add_ps(vsum);
            float *o = out + i * heads * d + h * d;
            int64_t c = 0;
            for (; c + 64 <= d; c += 64) {        /* four 16-wide column chunks at a time: four chains */
                __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
                for (int64_t j2 = 0; j2 < m; j2++) {
                    const __m512 p = _mm512_set1_ps(s[j2]);
                    const float *vj = V + j2 * d + c;
                    a0 = _mm512_fmadd_ps(p, _mm512_loadu_ps(vj), a0);
                    a1 = _mm512_fmadd_ps(p, _mm512_loadu_ps(vj + 16), a1);
                    a2 = _mm512_fmadd_ps(p, _mm512_loadu_ps(vj + 32), a2);
                    a3 = _mm512_fmadd_ps(p, _mm512_loadu_ps(vj + 48), a3);
                }
                const __m512 vinv = _mm512_set1_ps(inv);
                _mm512_storeu_ps(o + c, _mm512_mul_ps(a0, vinv));
                _mm512_storeu_ps(o + c + 16, _mm512_mul_ps(a1, vinv));
                _mm512_storeu_ps(o + c + 32, _mm512_mul_ps(a2, vinv));
                _mm512_storeu_ps(o + c + 48, _mm512_mul_ps(a3, vinv));
            }
            for (; c < d; c += 16) {              /* the same arithmetic for the last chunks */
                __m512 acc = _mm512_setzero_ps();
                for (int64_t j2 = 0; j2 < m; j2++)
                    acc = _mm512_fmadd_ps(_mm512_set1_ps(s[j2]), _mm512_loadu_ps(V + j2 * d + c), acc);
                _mm512_storeu_ps(o + c, _mm512_mul_ps(acc, _mm512_set1_ps(inv)));
            }
        }
        free(s);
    }
}
