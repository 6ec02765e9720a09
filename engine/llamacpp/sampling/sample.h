// Host sampling of one row of logits, in time linear in the vocabulary.
// See sampling.go for what it promises.
#ifndef DPN_SAMPLE_H
#define DPN_SAMPLE_H

#include <stdint.h>

// Values are processed in blocks of this many; the scratch holds one
// float per block beside one per token.
#define DPN_BLOCK 1024

// dpn_scratch_floats is the floats of scratch dpn_sample needs for a
// vocabulary of n tokens; it also needs 2n uint64s of keys.
static inline int64_t dpn_scratch_floats(int32_t n) { return (int64_t)n + n / DPN_BLOCK + 1; }

// dpn_sample draws a token from logits[0..n). Banned tokens are written
// -inf into logits first. temp <= 0 is greedy (the first of equal
// maxima); otherwise temperature, then min_p (0: off; tokens cut are
// written -inf), then top_k (0: off), then top_p (0 or 1: off), then a
// draw seeded by seed.
int32_t dpn_sample(float *logits, int32_t n, float temp, int32_t top_k, float top_p, float min_p, uint64_t seed,
                   const int32_t *banned, int32_t n_banned, float *scratch, uint64_t *keys);

// dpn_greedy is dpn_sample's greedy draw of a row with nothing banned,
// reading logits only; dpnode's argmax inside llama.cpp's graph on a CPU
// calls it, so that both places choose the same token.
int32_t dpn_greedy(const float *logits, int32_t n);

// dpn_logsumexp is log Σ e^logits[i], for log-probabilities: a logit
// less it is its token's log-probability.
float dpn_logsumexp(const float *logits, int32_t n);

// dpn_top writes the ids and logits of the k largest logits, largest
// first (ties by index), and returns how many it wrote; it needs
// dpn_sample's scratch and keys.
int32_t dpn_top(const float *logits, int32_t n, int32_t k, int32_t *ids, float *values, float *scratch, uint64_t *keys);

#endif
