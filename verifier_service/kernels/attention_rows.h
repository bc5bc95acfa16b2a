/* Which keys a (row, head) task of the exact-rows attention reads: shared by ops_generic.c and ops_simd.h.
   Task t = i * heads + h: row i (position p = start + i) of head h attends to positions begin..p, begin =
   max(0, p + 1 - window) (window 0: 0), of KV head h / (heads / kv_heads) of the [kv_heads, cap, d] caches. */
#pragma once
#include <stdint.h>

typedef struct {
    int64_t i, h, m;              /* row, head, number of keys */
    const float *q, *k, *v;       /* the row's query; the first key and value it reads */
} attention_task;

static inline attention_task attention_task_of(int64_t t, const float *q, int64_t q_row, int64_t heads,
                                               int64_t kv_heads, int64_t d, const float *k, const float *v,
                                               int64_t cap, int64_t start, int64_t window) {
    attention_task a;
    a.i = t / heads;
    a.h = t % heads;
    const int64_t end = start + a.i + 1, begin = window > 0 && end > window ? end - window : 0;
    const int64_t at = ((a.h / (heads / kv_heads)) * cap + begin) * d;
    a.m = end - begin;
    a.q = q + a.i * q_row + a.h * d;
    a.k = k + at;
    a.v = v + at;
    return a;
}
