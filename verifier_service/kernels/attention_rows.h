/* Which keys a (row, head) task of the exact-rows attention reads: shared by ops_generic.c and ops_simd.h.
   Task t = i * heads + h: row i (position p = start + i) of head h attends to positions begin..p, begin =
   max(0, p + 1 - window) (window 0: 0), of KV head h / (heads / kv_heads) of the [kv_heads, cap, d] caches.

   Several sessions' blocks (each over its own cache) are one call (``attention_block``, tq_attention_blocks):
   their tasks are numbered one block after another and shared among the threads in one parallel region, so
   a forward of many one-row sessions pays one fork and join a layer, not one a session, and the threads get
   equal shares of the work (attention_blocks_share). A task's arithmetic is the same whichever call or thread
   runs it: exact rows. */
#pragma once
#include <stdint.h>
#ifdef _OPENMP
#include <omp.h>
static inline int tq_thread(void) { return omp_get_thread_num(); }
static inline int tq_threads(void) { return omp_get_num_threads(); }
#else                             /* a build without OpenMP (the tests' emulated kernels): one thread */
static inline int tq_thread(void) { return 0; }
static inline int tq_threads(void) { return 1; }
#endif

typedef struct {
    int64_t i, h, m;              /* row, head, number of keys */
    const float *q, *k, *v;       /* the row's query; the first key and value it reads */
} attention_task;

typedef struct {                  /* one session's block: n rows of queries, its layer's caches, its output */
    const float *q;
    int64_t q_row, n;
    const float *k, *v;
    int64_t cap, start;
    float *out;                   /* [n, heads * d] */
} attention_block;

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

/* The longest causal prefix any task of ``blocks`` reads (the score buffer's size). */
static inline int64_t attention_blocks_longest(const attention_block *b, int64_t blocks) {
    int64_t longest = 0;
    for (int64_t i = 0; i < blocks; i++)
        if (b[i].start + b[i].n > longest) longest = b[i].start + b[i].n;
    return longest;
}

/* A row's work: the keys each of its tasks reads, and a fixed part (the softmax, the output row). */
static inline int64_t attention_row_cost(int64_t start, int64_t i, int64_t window) {
    const int64_t end = start + i + 1, begin = window > 0 && end > window ? end - window : 0;
    return end - begin + 16;
}

/* Thread ``tid`` of ``nth``'s share of the tasks of ``blocks``: [*from, *to), consecutive tasks (a thread
   reads few sessions' caches), cut where the work done before them is tid / nth of the whole, so threads
   finish together when the sessions' contexts differ in length. Which thread runs a task never changes its
   arithmetic. */
static inline void attention_blocks_share(const attention_block *b, int64_t blocks, int64_t heads, int64_t window,
                                          int tid, int nth, int64_t *from, int64_t *to) {
    int64_t total = 0;
    for (int64_t s = 0; s < blocks; s++)
        for (int64_t i = 0; i < b[s].n; i++) total += heads * attention_row_cost(b[s].start, i, window);
    const int64_t lo = total * tid / nth, hi = total * (tid + 1) / nth;
    int64_t done = 0, t = 0;
    *from = *to = -1;
    for (int64_t s = 0; s < blocks; s++)
        for (int64_t i = 0; i < b[s].n; i++) {
            const int64_t c = attention_row_cost(b[s].start, i, window);
            for (int64_t h = 0; h < heads; h++, t++, done += c) {
                if (*from < 0 && done >= lo) *from = t;           /* a task belongs where its work begins */
                if (*to < 0 && done >= hi) *to = t;
            }
        }
    if (*from < 0) *from = t;
    if (*to < 0 || tid == nth - 1) *to = t;
}

/* Task t of the whole call (t never decreases between calls on one thread): moves the thread's cursor (*blk,
   *before: tasks in the blocks before it) to t's block, and returns t's task there. */
static inline attention_task attention_blocks_task(const attention_block *b, int64_t t, int64_t *blk,
                                                   int64_t *before, int64_t heads, int64_t kv_heads, int64_t d,
                                                   int64_t window) {
    while (t - *before >= b[*blk].n * heads) {
        *before += b[*blk].n * heads;
        (*blk)++;
    }
    const attention_block *B = &b[*blk];
    return attention_task_of(t - *before, B->q, B->q_row, heads, kv_heads, d, B->k, B->v, B->cap, B->start, window);
}
