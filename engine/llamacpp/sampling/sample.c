// Host sampling of one row of logits, in time linear in the vocabulary.
//
// The hot loops run over 32 lanes written out as plain C, which the
// compiler vectorizes without reordering any lane's arithmetic (and with
// -ffp-contract=off, without fusing a multiply into an add): every x86-64
// computes the same bits, whatever its vector width, so that a request
// moved to another machine draws the same tokens.
// No multiply fused into an add, so that an FMA unit changes no result;
// and no trapping floating point, so that selects vectorize.
#pragma GCC optimize("fp-contract=off", "no-trapping-math")

#include <math.h>
#include <string.h>

#include "sample.h"

#define LANES 32

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DPN_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define DPN_CLONES
#endif

static inline float dpn_max(float a, float b) { return a > b ? a : b; }

// block_max is the largest of x[0..n); -inf when n is 0.
DPN_CLONES static float block_max(const float *x, int32_t n) {
    float acc[LANES];
    for (int j = 0; j < LANES; j++) {
        acc[j] = -INFINITY;
    }
    int32_t i = 0;
    for (; i + LANES <= n; i += LANES) {
        for (int j = 0; j < LANES; j++) {
            acc[j] = dpn_max(x[i + j], acc[j]);
        }
    }
    float m = -INFINITY;
    for (int j = 0; j < LANES; j++) {
        m = dpn_max(acc[j], m);
    }
    for (; i < n; i++) {
        m = dpn_max(x[i], m);
    }
    return m;
}

// exp_neg is e^x for x <= 0, Cephes' single-precision expf without
// branches; below -87, where e^x leaves the normal floats, it is 0, as it
// is for -inf (a banned token).
static inline float exp_neg(float x) {
    float xc = dpn_max(x, -87.0f);
    // Round x·log2(e) to an integer n by adding 1.5·2^23.
    float t = xc * 1.44269504088896341f + 12582912.0f;
    float n = t - 12582912.0f;
    int32_t ni;
    memcpy(&ni, &t, sizeof ni);
    ni -= 0x4B400000;
    // x - n·ln(2), in two parts (Cody and Waite).
    float f = xc - n * 0.693359375f;
    f = f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * f + 1.3981999507e-3f;
    p = p * f + 8.3334519073e-3f;
    p = p * f + 4.1665795894e-2f;
    p = p * f + 1.6666665459e-1f;
    p = p * f + 5.0000001201e-1f;
    p = p * f * f + f + 1.0f;
    int32_t bits = (ni + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale * (float)(x >= -87.0f);
}

// exp_block writes w[i] = e^((l[i]-m)·inv_t) for i in [0, n), n at most
// DPN_BLOCK, when w is not NULL, and returns their sum, added in the same
// order everywhere.
DPN_CLONES static float exp_block(const float *l, float *w, int32_t n, float m, float inv_t) {
    float e[DPN_BLOCK];
    for (int32_t i = 0; i < n; i++) {
        e[i] = exp_neg((l[i] - m) * inv_t);
    }
    float acc[LANES];
    for (int j = 0; j < LANES; j++) {
        acc[j] = 0.0f;
    }
    int32_t i = 0;
    for (; i + LANES <= n; i += LANES) {
        for (int j = 0; j < LANES; j++) {
            acc[j] += e[i + j];
        }
    }
    float s = 0.0f;
    for (int j = 0; j < LANES; j++) {
        s += acc[j];
    }
    for (; i < n; i++) {
        s += e[i];
    }
    if (w != NULL) {
        memcpy(w, e, (size_t)n * sizeof *w);
    }
    return s;
}

// uniform is a double in [0, 1) from a 64-bit seed (SplitMix64's mix).
static double uniform(uint64_t seed) {
    uint64_t z = seed + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) * 0x1.0p-53;
}

// row_max is the largest logit, and the first block that holds it.
static float row_max(const float *l, int32_t n, int32_t *first_block) {
    float m = -INFINITY;
    *first_block = 0;
    for (int32_t b = 0; (int64_t)b * DPN_BLOCK < n; b++) {
        int32_t k = n - b * DPN_BLOCK < DPN_BLOCK ? n - b * DPN_BLOCK : DPN_BLOCK;
        float bm = block_max(l + (int64_t)b * DPN_BLOCK, k);
        if (bm > m) {
            m = bm;
            *first_block = b;
        }
    }
    return m;
}

// first_allowed is the first token not banned: the draw when no token
// has a logit above -inf.
static int32_t first_allowed(int32_t n, const int32_t *banned, int32_t n_banned) {
    for (int32_t i = 0; i < n; i++) {
        int32_t j = 0;
        while (j < n_banned && banned[j] != i) {
            j++;
        }
        if (j == n_banned) {
            return i;
        }
    }
    return 0;
}

// argmax is the first index of the largest logit, m, in block b or after.
static int32_t argmax_from(const float *l, int32_t n, float m, int32_t b) {
    for (int32_t i = b * DPN_BLOCK; i < n; i++) {
        if (l[i] == m) {
            return i;
        }
    }
    return 0;
}

// greedy is the first of the largest logits: the block maxima find its
// block, and only that block is read again. With every logit -inf it is
// the first token not banned.
static int32_t greedy(const float *l, int32_t n, const int32_t *banned, int32_t n_banned) {
    int32_t first;
    const float m = row_max(l, n, &first);
    if (!(m > -INFINITY)) {
        return first_allowed(n, banned, n_banned);
    }
    return argmax_from(l, n, m, first);
}

int32_t dpn_greedy(const float *logits, int32_t n) { return greedy(logits, n, NULL, 0); }

// A candidate's key sorts by logit, largest first, then by index.
static uint64_t key_of(float v, int32_t i) {
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((uint64_t)(~u) << 32) | (uint32_t)i;
}

static float key_value(uint64_t k) {
    uint32_t u = ~(uint32_t)(k >> 32);
    u = (u & 0x80000000u) ? (u & 0x7FFFFFFFu) : ~u;
    float v;
    memcpy(&v, &u, sizeof v);
    return v;
}

static int32_t key_index(uint64_t k) { return (int32_t)(uint32_t)k; }

// sort_keys sorts keys[0..cnt) by value, largest first, keeping the order
// of equal values: a radix sort of the keys' upper 32 bits, 11 at a time,
// through tmp (cnt more keys).
static void sort_keys(uint64_t *keys, uint64_t *tmp, int32_t cnt) {
    if (cnt <= 256) {
        for (int32_t i = 1; i < cnt; i++) {
            uint64_t k = keys[i];
            int32_t j = i;
            while (j > 0 && (keys[j - 1] >> 32) > (k >> 32)) {
                keys[j] = keys[j - 1];
                j--;
            }
            keys[j] = k;
        }
        return;
    }
    uint64_t *src = keys, *dst = tmp;
    for (int shift = 32; shift < 64; shift += 11) {
        uint32_t count[2048] = {0};
        for (int32_t i = 0; i < cnt; i++) {
            count[(src[i] >> shift) & 2047]++;
        }
        uint32_t sum = 0;
        for (int d = 0; d < 2048; d++) {
            uint32_t c = count[d];
            count[d] = sum;
            sum += c;
        }
        for (int32_t i = 0; i < cnt; i++) {
            dst[count[(src[i] >> shift) & 2047]++] = src[i];
        }
        uint64_t *t = src;
        src = dst;
        dst = t;
    }
    // Three passes leave the sorted keys in tmp.
    memcpy(keys, src, (size_t)cnt * sizeof *keys);
}

// run_maxima writes the maximum of each run of 64 logits to out.
DPN_CLONES static void run_maxima(const float *l, int32_t n, float *out) {
    int32_t r = 0, lo = 0;
    for (; lo + 64 <= n; lo += 64) {
        float acc[LANES];
        for (int j = 0; j < LANES; j++) {
            acc[j] = dpn_max(l[lo + j], l[lo + LANES + j]);
        }
        float m = -INFINITY;
        for (int j = 0; j < LANES; j++) {
            m = dpn_max(acc[j], m);
        }
        out[r++] = m;
    }
    if (lo < n) {
        float m = -INFINITY;
        for (; lo < n; lo++) {
            m = dpn_max(l[lo], m);
        }
        out[r] = m;
    }
}

// top_candidates writes the keys of the k largest logits to keys, in
// order, and returns how many it wrote (k, or n when n < k). It keeps a
// buffer of up to 2k candidates, cut back to the k best when full; past
// the first cut only a logit above the k-th best so far can enter, and a
// run of 64 whose maximum cannot is skipped whole. Keys enter in index
// order, so a stable sort by value keeps ties in index order.
static int32_t top_candidates(const float *l, int32_t n, int32_t k, uint64_t *keys, uint64_t *tmp, float *runs) {
    if (k >= n / 2) {
        for (int32_t i = 0; i < n; i++) {
            keys[i] = key_of(l[i], i);
        }
        sort_keys(keys, tmp, n);
        return k < n ? k : n;
    }
    // The k-th largest run maximum is at most the k-th largest logit:
    // nothing below it can be among the k.
    run_maxima(l, n, runs);
    const int32_t nruns = (n + 63) / 64;
    float floor = -INFINITY;
    if (nruns >= k) {
        for (int32_t r = 0; r < nruns; r++) {
            keys[r] = key_of(runs[r], r);
        }
        sort_keys(keys, tmp, nruns);
        floor = key_value(keys[k - 1]);
    }
    int32_t cnt = 0;
    int full = 0;
    float thr = -INFINITY;
    for (int32_t lo = 0; lo < n; lo += 64) {
        int32_t hi = n - lo < 64 ? n : lo + 64;
        if (runs[lo / 64] < floor || (full && !(runs[lo / 64] > thr))) {
            continue;
        }
        for (int32_t i = lo; i < hi; i++) {
            if (l[i] < floor || (full && !(l[i] > thr))) {
                continue;
            }
            keys[cnt++] = key_of(l[i], i);
            if (cnt == 2 * k) {
                sort_keys(keys, tmp, cnt);
                cnt = k;
                full = 1;
                thr = key_value(keys[k - 1]);
            }
        }
    }
    sort_keys(keys, tmp, cnt);
    return cnt < k ? cnt : k;
}

// draw_blocks draws from the weights e^((l[i]-m)·inv_t) at target in
// [0, their total): the first index where the running sum passes it.
// Block b's weights are its own, e^((l[i]-bmax[b])·inv_t), which sum to
// bsum[b], scaled by e^((bmax[b]-m)·inv_t): only the block where the sum
// passes target is weighed again.
static int32_t draw_blocks(const float *l, int32_t n, const float *bmax, const float *bsum, float m, float inv_t, double target) {
    float w[DPN_BLOCK];
    double acc = 0;
    int32_t last = 0;
    for (int32_t b = 0; (int64_t)b * DPN_BLOCK < n; b++) {
        if (!(bsum[b] > 0.0f)) {
            continue;
        }
        last = b;
        const float scale = exp_neg((bmax[b] - m) * inv_t);
        if (acc + (double)bsum[b] * scale <= target) {
            acc += (double)bsum[b] * scale;
            continue;
        }
        int32_t lo = b * DPN_BLOCK, k = n - lo < DPN_BLOCK ? n - lo : DPN_BLOCK;
        exp_block(l + lo, w, k, bmax[b], inv_t);
        for (int32_t i = 0; i < k; i++) {
            acc += (double)w[i] * scale;
            if (acc > target) {
                return lo + i;
            }
        }
        // Rounding: the block's own sum came out below its total. The
        // draw goes on into the next blocks.
    }
    // Rounding kept the sum below target: the last token that can be
    // drawn.
    int32_t lo = last * DPN_BLOCK, k = n - lo < DPN_BLOCK ? n - lo : DPN_BLOCK;
    exp_block(l + lo, w, k, bmax[last], inv_t);
    while (k > 1 && w[k - 1] == 0.0f) {
        k--;
    }
    return lo + k - 1;
}

// cut_below writes -inf over every logit below floor.
DPN_CLONES static void cut_below(float *l, int32_t n, float floor) {
    for (int32_t i = 0; i < n; i++) {
        l[i] = l[i] < floor ? -INFINITY : l[i];
    }
}

int32_t dpn_sample(float *logits, int32_t n, float temp, int32_t top_k, float top_p, float min_p, uint64_t seed,
                   const int32_t *banned, int32_t n_banned, float *scratch, uint64_t *keys) {
    for (int32_t i = 0; i < n_banned; i++) {
        if (banned[i] >= 0 && banned[i] < n) {
            logits[banned[i]] = -INFINITY;
        }
    }
    if (temp > 0.0f && min_p > 0.0f) {
        // Min-p, before top-k and top-p: a token less likely than min_p
        // times the most likely, e^((l-m)/temp) < min_p, is left out.
        int32_t first;
        const float m = row_max(logits, n, &first);
        if (m > -INFINITY) {
            cut_below(logits, n, m + (float)((double)temp * log((double)min_p)));
        }
    }
    if (temp <= 0.0f) {
        return greedy(logits, n, banned, n_banned);
    }
    const float inv_t = 1.0f / temp;
    const int all = top_k <= 0 || top_k >= n;
    const int nucleus = top_p > 0.0f && top_p < 1.0f;
    // Each block's maximum and, where every token is weighed, its
    // weights' sum relative to it: one read of the row, since the block
    // is in the nearest cache for the second look.
    float *w = scratch;
    float *bmax = scratch, *bsum = scratch + n;
    float m = -INFINITY;
    for (int32_t b = 0; (int64_t)b * DPN_BLOCK < n; b++) {
        int32_t lo = b * DPN_BLOCK, k = n - lo < DPN_BLOCK ? n - lo : DPN_BLOCK;
        bmax[b] = block_max(logits + lo, k);
        bsum[b] = all && bmax[b] > -INFINITY ? exp_block(logits + lo, NULL, k, bmax[b], inv_t) : 0.0f;
        m = dpn_max(bmax[b], m);
    }
    if (!(m > -INFINITY)) {
        return first_allowed(n, banned, n_banned);
    }
    double total = 0;
    for (int32_t b = 0; (int64_t)b * DPN_BLOCK < n; b++) {
        if (bsum[b] > 0.0f) {
            total += (double)bsum[b] * exp_neg((bmax[b] - m) * inv_t);
        }
    }
    if (all && !nucleus) {
        return draw_blocks(logits, n, bmax, bsum, m, inv_t, uniform(seed) * total);
    }
    // Top-k, or the nucleus of top-p, among the largest logits, found
    // without sorting the vocabulary. For top-p alone the candidates
    // double until the nucleus is among them. Block maxima and sums are
    // no longer needed: the candidates' weights overwrite them.
    int32_t k = all ? (n < 256 ? n : 256) : top_k;
    for (;;) {
        const int32_t c = top_candidates(logits, n, k, keys, keys + n, w);
        double sum = 0;
        for (int32_t j = 0; j < c; j++) {
            w[j] = exp_neg((key_value(keys[j]) - m) * inv_t);
            sum += w[j];
        }
        int32_t keep = c;
        if (nucleus) {
            // The fewest tokens, most likely first, whose mass reaches
            // top_p of the mass: of every token's, or of the top-k's.
            const double need = (double)top_p * (all ? total : sum);
            double cum = 0;
            keep = 0;
            while (keep < c && cum < need) {
                cum += w[keep++];
            }
            if (cum < need && all && c < n) {
                k = k > n / 2 ? n : 2 * k;
                continue;
            }
            keep = keep > 0 ? keep : 1;
            sum = 0;
            for (int32_t j = 0; j < keep; j++) {
                sum += w[j];
            }
        }
        const double target = uniform(seed) * sum;
        double acc = 0;
        int32_t last = 0;
        for (int32_t j = 0; j < keep; j++) {
            if (w[j] > 0.0f) {
                last = j;
            }
            acc += w[j];
            if (acc > target) {
                return key_index(keys[j]);
            }
        }
        return key_index(keys[last]);
    }
}

float dpn_logsumexp(const float *logits, int32_t n) {
    int32_t first;
    const float m = row_max(logits, n, &first);
    if (!(m > -INFINITY)) {
        return m;
    }
    double total = 0;
    for (int32_t lo = 0; lo < n; lo += DPN_BLOCK) {
        const int32_t k = n - lo < DPN_BLOCK ? n - lo : DPN_BLOCK;
        total += (double)exp_block(logits + lo, NULL, k, m, 1.0f);
    }
    return m + (float)log(total);
}

int32_t dpn_top(const float *logits, int32_t n, int32_t k, int32_t *ids, float *values, float *scratch, uint64_t *keys) {
    if (k <= 0 || n <= 0) {
        return 0;
    }
    const int32_t c = top_candidates(logits, n, k, keys, keys + n, scratch);
    for (int32_t j = 0; j < c; j++) {
        ids[j] = key_index(keys[j]);
        values[j] = key_value(keys[j]);
    }
    return c;
}
