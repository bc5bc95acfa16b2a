/* The decoder's layer loop in one call: decoder.py's loop over the layers (qkv GEMM, q/k norms, rope + KV
   store, exact-rows attention of each session's block over its own cache, o GEMM, post norms, residual +
   norm, gate/up GEMM, gated activation, down GEMM) for blocks of up to WIDE_ROWS rows on GGUF blocks, with no
   Python between the kernels. Every step calls the kernel decoder.py's NativeOps / quant.py call for it, with
   the same arguments, so each output is bit-identical to that loop's (tests/unit/test_decoder_layers.py);
   the one difference: the attention of all sessions' blocks is one call (tq_attention_blocks: one parallel
   region a layer, not one a session; each (row, head) computed as a call of its own block computes it).
   What this saves is the interpreter's work between ~300 kernel calls a forward (about a quarter of a one-row
   forward of the default target) and the GIL, released for the whole forward.

   ISA-independent: the ISA's functions (GEMMs, attention, the gated product) come as pointers from
   verifier_service/native_layers.py, which builds these descriptions once per decoder. */
#include <stdint.h>
#include <stdlib.h>

#include "attention_rows.h"

/* quant.py's four GEMM entry-point forms (quants.h, gemm_q8_dispatch.h, gemm_q8x8_x86.h) */
enum { TQ_LINEAR_ONE = 0, TQ_LINEAR_ONE_X8 = 1, TQ_LINEAR_PARTS = 2, TQ_LINEAR_PARTS_X8 = 3 };

typedef int (*gemm_one_fn)(int, const float *, int64_t, int64_t, const void *, int64_t, int64_t, const float *,
                           float *, int64_t, int);
typedef int (*gemm_one_x8_fn)(int, const float *, int64_t, int64_t, const void *, int64_t, const float *, float *,
                              int64_t, int);
typedef int (*gemm_parts_fn)(int, const int *, const void *, const int64_t *, const int64_t *, const float *,
                             int64_t, int64_t, float *, int64_t, int);
typedef int (*gemm_parts_x8_fn)(int, const int *, const void *, const int64_t *, const float *, int64_t, int64_t,
                                float *, int64_t, int);
typedef void (*attention_blocks_fn)(const attention_block *, int64_t, int64_t, int64_t, int64_t, int64_t, float,
                                    int);
typedef void (*gated_fn)(const float *, int64_t, int64_t, float *);

/* One linear as quant.QuantWeight.matmul or quant.SideBySide.matmul calls its kernel. */
typedef struct {
    int64_t form, kind, parts;    /* form: TQ_LINEAR_*; kind: the GGUF type (ONE forms); parts (PARTS forms) */
    void *fn;                     /* the entry point */
    const void *w;                /* ONE: the blocks or the x8 copy; PARTS: the array of each part's */
    int64_t ldw, out, inner;      /* ldw: bytes a row (TQ_LINEAR_ONE); out: every column */
    const int *kinds;             /* PARTS: each part's type, row bytes (TQ_LINEAR_PARTS) and columns */
    const int64_t *ldws, *outs;
} tq_linear;

typedef struct {
    tq_linear qkv, o, gate_up, down;
    const float *qkv_bias, *q_norm, *k_norm, *post_attn_norm, *post_ffn_norm;    /* NULL where absent */
    const float *ffn_norm, *next_norm;   /* next_norm: the following layer's attention norm, or the final norm */
    int64_t window, rope_group;
} tq_layer;

typedef struct {
    int64_t layers, hidden, heads, kv_heads, d, ffn;
    float eps, scale;
    int64_t interleaved;
    void *attention, *gated;      /* the ISA's tq_attention_blocks_<isa>; its SiLU or GELU-tanh product */
    const float *first_norm;      /* layer 0's attention norm */
    const tq_layer *layer;
} tq_decoder;

typedef struct {                  /* one session's block: rows first..first+n-1 at positions start.. */
    float *kv;                    /* its cache [layers, 2, kv_heads, cap, d] */
    int64_t cap, start, first, n;
} tq_segment;

void tq_add_rms_norm(float *x, const float *y, int64_t n, int64_t dim, const float *w, float eps, float *h);
void tq_head_rms_norm(float *x, int64_t n, int64_t row, int64_t heads, int64_t d, const float *w, float eps);
void tq_rope_store(const float *qkv, int64_t n, int64_t heads, int64_t kv_heads, int64_t d, const float *cos_,
                   const float *sin_, float *k_cache, float *v_cache, int64_t cap, int64_t start, float *q_out,
                   int interleaved);

static int linear(const tq_linear *l, const float *x, int64_t n, float *y, int threads) {
    switch (l->form) {
    case TQ_LINEAR_ONE:
        return ((gemm_one_fn)l->fn)((int)l->kind, x, n, l->inner, l->w, l->ldw, l->out, 0, y, l->out, threads);
    case TQ_LINEAR_ONE_X8:
        return ((gemm_one_x8_fn)l->fn)((int)l->kind, x, n, l->inner, l->w, l->out, 0, y, l->out, threads);
    case TQ_LINEAR_PARTS:
        return ((gemm_parts_fn)l->fn)((int)l->parts, l->kinds, l->w, l->ldws, l->outs, x, n, l->inner, y, l->out,
                                      threads);
    case TQ_LINEAR_PARTS_X8:
        return ((gemm_parts_x8_fn)l->fn)((int)l->parts, l->kinds, l->w, l->outs, x, n, l->inner, y, l->out,
                                         threads);
    }
    return -1;
}

/* x [rows, hidden]: the scaled embeddings in, the residual stream after the last layer out; h [rows, hidden]
   out: the final norm of it (the head's input). cos/sin: each rope group's table [positions, d]. 0, or the
   layer (1-based) whose GEMM refused its input, or -1 when out of memory. */
int tq_decoder_layers(const tq_decoder *m, const tq_segment *seg, int64_t segments, const float *const *cos_,
                      const float *const *sin_, float *x, int64_t rows, float *h, int threads) {
    const int64_t H = m->heads, KV = m->kv_heads, D = m->d, hid = m->hidden, qkv_row = (H + 2 * KV) * D;
    float *mem = (float *)malloc(sizeof(float) * (size_t)rows * (size_t)(qkv_row + 2 * H * D + 3 * hid + 3 * m->ffn));
    attention_block *blocks = (attention_block *)malloc(sizeof(attention_block) * (size_t)(segments ? segments : 1));
    if (!mem || !blocks) {
        free(mem);
        free(blocks);
        return -1;
    }
    float *qkv = mem, *q = qkv + rows * qkv_row, *att = q + rows * H * D, *o = att + rows * H * D;
    float *post = o + rows * hid, *down = post + rows * hid, *gu = down + rows * hid, *act = gu + rows * 2 * m->ffn;
    const attention_blocks_fn attend = (attention_blocks_fn)m->attention;
    const gated_fn gated = (gated_fn)m->gated;
    int rc = 0;
    tq_add_rms_norm(x, 0, rows, hid, m->first_norm, m->eps, h);
    for (int64_t i = 0; i < m->layers && !rc; i++) {
        const tq_layer *L = &m->layer[i];
        if (linear(&L->qkv, h, rows, qkv, threads)) { rc = (int)i + 1; break; }
        if (L->qkv_bias)                                          /* qkv += bias, as torch adds it */
            for (int64_t r = 0; r < rows; r++)
                for (int64_t c = 0; c < qkv_row; c++) qkv[r * qkv_row + c] += L->qkv_bias[c];
        for (int64_t s = 0; s < segments; s++) {                  /* each block over its own cache */
            const tq_segment *S = &seg[s];
            float *block = qkv + S->first * qkv_row, *k = S->kv + i * 2 * KV * S->cap * D, *v = k + KV * S->cap * D;
            if (L->q_norm) {
                tq_head_rms_norm(block, S->n, qkv_row, H, D, L->q_norm, m->eps);
                tq_head_rms_norm(block + H * D, S->n, qkv_row, KV, D, L->k_norm, m->eps);
            }
            tq_rope_store(block, S->n, H, KV, D, cos_[L->rope_group] + S->start * D, sin_[L->rope_group] + S->start * D,
                          k, v, S->cap, S->start, q + S->first * H * D, (int)m->interleaved);
            const attention_block B = {q + S->first * H * D, H * D, S->n, k, v, S->cap, S->start, att + S->first * H * D};
            blocks[s] = B;
        }
        attend(blocks, segments, H, KV, D, L->window, m->scale, threads);       /* every block's heads at once */
        if (linear(&L->o, att, rows, o, threads)) { rc = (int)i + 1; break; }
        const float *add = o;
        if (L->post_attn_norm) { tq_add_rms_norm(o, 0, rows, hid, L->post_attn_norm, m->eps, post); add = post; }
        tq_add_rms_norm(x, add, rows, hid, L->ffn_norm, m->eps, h);                  /* x += o; h = norm(x) */
        if (linear(&L->gate_up, h, rows, gu, threads)) { rc = (int)i + 1; break; }
        gated(gu, rows, m->ffn, act);
        if (linear(&L->down, act, rows, down, threads)) { rc = (int)i + 1; break; }
        add = down;
        if (L->post_ffn_norm) { tq_add_rms_norm(down, 0, rows, hid, L->post_ffn_norm, m->eps, post); add = post; }
        tq_add_rms_norm(x, add, rows, hid, L->next_norm, m->eps, h);                 /* x += down; h = norm(x) */
    }
    free(mem);
    free(blocks);
    return rc;
}
