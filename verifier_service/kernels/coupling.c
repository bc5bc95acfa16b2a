/* Coupled sampling's scan of a whole logits row (tandem/coupling.py, ``coupled_choice``): the tokens that can
   still win the Gumbel-max race once the top token's score is known. Token i is a candidate when its scaled
   logit (double)l[i] / t reaches `floor`, or when its 53-bit noise integer (SplitMix64 of (i + 1) * golden +
   key, shifted right by 11) is at least `high`. The integers are the bits numpy's uniform_bits computes, and
   the scaled logit the same IEEE division, so the candidates are exactly the numpy reference's; the caller
   adds the Gumbel noise (numpy's log) to the few candidates only.

   One pass, no allocation: on the 262 144-token vocabulary of Gemma 3 it takes a fraction of the numpy
   reference's ~3.5 ms of hashing a token (BENCHMARKS.md, thirtieth session). Returns how many candidates
   there are; the first `cap` are written (index, bits) in ascending order. */
#include <stdint.h>

#define GOLDEN 0x9E3779B97F4A7C15ULL
#define MUL1 0xBF58476D1CE4E5B9ULL
#define MUL2 0x94D049BB133111EBULL

int64_t tq_coupled_candidates(const float *l, int64_t n, double t, uint64_t key, uint64_t high, double floor,
                              int64_t *index, uint64_t *bits, int64_t cap) {
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++) {
        uint64_t x = ((uint64_t)i + 1) * GOLDEN + key;
        x ^= x >> 30;
        x *= MUL1;
        x ^= x >> 27;
        x *= MUL2;
        x ^= x >> 31;
        x >>= 11;
        if ((double)l[i] / t >= floor || x >= high) {
            if (m < cap) {
                index[m] = i;
                bits[m] = x;
            }
            m++;
        }
    }
    return m;
}
