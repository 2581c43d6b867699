/* A token drawn from a row of logits, from the distribution streamkit.engine.sampling.target_probs
 * defines: repetition penalty (a logit of a token seen before divided by it where positive,
 * multiplied where not), temperature, top-k (every logit at least the k-th largest), top-p (the
 * fewest most likely tokens whose mass reaches p: a token stays while the mass before it is at most
 * p), then a draw (sample_draw; at temperature 0 the caller takes the argmax of the penalized
 * logits).
 *
 * The draw's uniform number is a hash of the sequence's seed and the position of the token whose
 * logits these are, so a seeded sequence gets the same tokens whichever steps, batches or decode
 * bursts computed them. Top-p sorts only the tokens that can be in its set: those at least a
 * threshold whose mass reaches p, at first a thousandth of the most likely one's probability, else
 * (1 - p) / vocab of the total, below which the tokens' mass is less than 1 - p. Included by
 * sk_kernels.c only. */
#ifndef SK_SAMPLE_H
#define SK_SAMPLE_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

/* one row's settings (arrays of S in the entry points) */
typedef struct {
    float temperature, top_p, penalty;
    int top_k;
    uint64_t seed;
    int pos;
    const uint8_t *seen; /* bit t: token t came before (read where penalty != 1) */
} sample_spec;

static inline uint64_t sample_mix(uint64_t x) { /* splitmix64's finalizer */
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* uniform in [0, 1), 53 bits */
static inline double sample_uniform(uint64_t seed, int pos) {
    return (double)(sample_mix(seed ^ sample_mix((uint64_t)(uint32_t)pos)) >> 11) * 0x1.0p-53;
}

/* the k-th largest of z[0..n) (1 <= k <= n) for k up to SK_SAMPLE_HEAP_K: a min-heap of the k
 * largest so far, which most values pass by in one vector compare with its least */
#define SK_SAMPLE_HEAP_K 1024
static float kth_largest_heap(const float *z, int n, int k, float *h) {
    for (int i = 0; i < k; i++) h[i] = -INFINITY;
    for (int i = 0; i < n;) {
        if (i + 16 <= n && !v16_gt_mask(v16_load(z + i), v16_set1(h[0]))) {
            i += 16;
            continue;
        }
        const int end = i + 16 <= n ? i + 16 : i + 1;
        for (; i < end; i++) {
            if (!(z[i] > h[0])) continue;
            int j = 0; /* the least replaced, then sifted down */
            for (;;) {
                int c = 2 * j + 1;
                if (c >= k) break;
                if (c + 1 < k && h[c + 1] < h[c]) c++;
                if (h[c] >= z[i]) break;
                h[j] = h[c];
                j = c;
            }
            h[j] = z[i];
        }
    }
    return h[0];
}

/* the k-th largest of a[0..n) (1 <= k <= n), reordering a */
static float kth_largest(float *a, int n, int k) {
    int lo = 0, hi = n - 1;
    const int want = k - 1; /* index in descending order */
    while (lo < hi) {
        const float pivot = a[lo + (hi - lo) / 2];
        int i = lo, j = hi;
        while (i <= j) {
            while (a[i] > pivot) i++;
            while (a[j] < pivot) j--;
            if (i <= j) {
                const float x = a[i];
                a[i++] = a[j];
                a[j--] = x;
            }
        }
        if (want <= j) hi = j;
        else if (want >= i) lo = i;
        else return a[want];
    }
    return a[want];
}

typedef struct {
    float p;
    int32_t tok;
} sample_cand;

static int sample_cand_desc(const void *a, const void *b) {
    const sample_cand *x = a, *y = b;
    if (x->p != y->p) return x->p < y->p ? 1 : -1;
    return x->tok - y->tok;
}

/* the repetition penalty on the row's logits z, in place */
static void sample_penalize(float *z, int V, const sample_spec *s) {
    if (s->penalty != 1.0f && s->seen)
        for (int i = 0; i < V; i++)
            if (s->seen[i >> 3] >> (i & 7) & 1) z[i] = z[i] > 0 ? z[i] / s->penalty : z[i] * s->penalty;
}

/* the draw (temperature > 0) from the row's penalized logits z, overwritten; scratch: vocab * 8 bytes */
static int sample_draw(float *z, int V, const sample_spec *s, void *scratch) {
    const float temp = s->temperature > 1e-5f ? s->temperature : 1e-5f;
    int i = 0;
    float mx = -INFINITY;
    for (; i + 16 <= V; i += 16) {
        const v16 x = v16_div(v16_load(z + i), v16_set1(temp));
        v16_store(z + i, x);
        mx = fmaxf(mx, v16_hmax(x));
    }
    for (; i < V; i++) z[i] /= temp, mx = fmaxf(mx, z[i]);
    float lo = -INFINITY; /* logits below are out (top-k) */
    if (s->top_k > 0 && s->top_k < V) {
        float *c = scratch;
        if (s->top_k <= SK_SAMPLE_HEAP_K) {
            lo = kth_largest_heap(z, V, s->top_k, c);
        } else {
            memcpy(c, z, (size_t)V * sizeof(float));
            lo = kth_largest(c, V, s->top_k);
        }
    }
    double sum = 0.0;
    for (i = 0; i + 16 <= V; i += 16) {
        const v16 x = v16_load(z + i);
        v16 p = v16_exp(v16_sub(x, v16_set1(mx)));
        const int in = v16_ge_mask(x, v16_set1(lo));
        if (in != 0xFFFF) {
            float t[16];
            v16_store(t, p);
            for (int j = 0; j < 16; j++)
                if (!(in >> j & 1)) t[j] = 0.0f;
            p = v16_load(t);
        }
        v16_store(z + i, p);
        sum += v16_hsum(p);
    }
    for (; i < V; i++) z[i] = z[i] >= lo ? expf(z[i] - mx) : 0.0f, sum += z[i];
    const double u = sample_uniform(s->seed, s->pos);
    if (!(s->top_p < 1.0f)) {
        const double r = u * sum;
        double acc = 0.0;
        int last = 0;
        for (i = 0; i < V; i++)
            if (z[i] > 0.0f) {
                acc += z[i];
                last = i;
                if (acc > r) return i;
            }
        return last;
    }
    const double need = (double)s->top_p * sum;
    sample_cand *c = scratch;
    int n = 0;
    for (int pass = 0; pass < 2; pass++) { /* the probability of the most likely token is exp(0) = 1 */
        const float t = pass == 0 ? 1e-3f : (float)((1.0 - s->top_p) / V * sum);
        double mass = 0.0;
        n = 0;
        for (i = 0; i < V; i++)
            if (z[i] >= t && z[i] > 0.0f) c[n].p = z[i], c[n++].tok = i, mass += z[i];
        if (mass >= need) break;
    }
    qsort(c, (size_t)n, sizeof *c, sample_cand_desc);
    double kept = 0.0;
    int k = 0;
    while (k < n && kept <= need) kept += c[k++].p;
    const double r = u * kept;
    double acc = 0.0;
    for (int j = 0; j < k; j++) {
        acc += c[j].p;
        if (acc > r) return c[j].tok;
    }
    return c[k - 1].tok;
}

#endif
