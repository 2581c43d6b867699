/* The LM head of greedy steps of few rows (fewer than SK_GREEDY_MIN_ROWS: batch-1 decoding,
 * a speculative check of k + 1 rows): each row's largest logit, read mostly from a 4-bit copy of a
 * Q8_0 head (below) or of a Q6_K head (h4_prepare_q6k).
 *
 * A few-row step streams every weight once, so the head's bytes are its time: SmolLM2's Q8_0 head is
 * 31.9 of a batch-1 step's 113 MB (36 bytes a block of 32 in the kernels' layout). The copy is Q4_1
 * (24 bytes a block), each block re-quantized from its own integers:
 * w'_k = s * u_k + m with m = d * min q, s = d * (max q - min q) / 15, u_k = round((q_k - min q) * 15 /
 * (max q - min q)). The few-row kernels give a_c = x . w'_c, and the error e_c = x . (w_c - w'_c) is a
 * sum of K products of x with residuals within s / 2 that behave like noise, so |e_c| is on the
 * order of sigma_c ||x||, sigma_c the rms of column c's residuals (made here, in float64). SmolLM2's
 * head against 1004 final hidden states of greedy decoding (24 prompts x 64 tokens, float64), 49 M
 * (row, column) pairs: the largest |e_c| / (sigma_c ||x||) was 5.96, the largest of as many Gaussian
 * draws. Every column with a_c + 8 sigma_c ||x|| >= max_j (a_j - 8 sigma_j ||x||) is computed
 * exactly (gh_exact: the dequantized Q8_0 weights and the fp32 row; 220 columns a row on average,
 * median 73, 99th percentile 2067, at most 3744 there) and the largest of them, the first on a
 * tie, is the token.
 *
 * Unlike the greedy head's bound (sk_greedy.h) this is not a proof: the worst case of 4-bit
 * residuals (15 sigma_c ||x|| wide and more) rules out no column at all. A token differs from the
 * fp32 head's only where a column near the top errs by more than 8 sigma_c ||x||, which in a
 * Gaussian has odds of about 1e-15 a column; the engine's gate (greedy output against the fp32 build,
 * one prompt at a time) checks it. A row whose copy gives no finite candidate (NaN or infinite x)
 * takes every column exactly, as the greedy head does. Included by sk_kernels.c after sk_greedy.h
 * (gh_exact, gh_better). */
#ifndef SK_HEAD4_H
#define SK_HEAD4_H

#define H4_SIGMAS 8.0f

typedef struct {
    sk_w w;       /* the 4-bit copy (SK_Q4_1); w.qs NULL where the head is not one this path reads */
    float *sigma; /* [n]: rms of column c's residuals w_c - w'_c */
} h4_head;

INLINE int h4_format(const sk_w *w) {
    return w->n % 16 == 0 && ((w->fmt == SK_Q8_0 && w->k % 32 == 0) || (w->fmt == SK_Q6_K && w->k % 256 == 0));
}

static void h4_free(h4_head *h) {
    free((void *)h->w.qs); free((void *)h->w.sc); free(h->sigma);
    h->w.qs = NULL; h->w.sc = NULL; h->sigma = NULL;
}

/* block b's integers q -> the copy's nibbles (Q4_1's order: byte j holds values j and j + 16), its
 * scale and offset; returns the sum of the squared residuals d q - w' */
static double h4_block(const int8_t *q, float d, uint8_t *nib, float *s, float *m) {
    int lo = q[0], hi = q[0];
    for (int k = 1; k < 32; k++) lo = q[k] < lo ? q[k] : lo, hi = q[k] > hi ? q[k] : hi;
    *m = d * (float)lo; /* exact: an fp16 d times an 8-bit integer */
    *s = hi > lo ? d * (float)(hi - lo) / 15.0f : 0.0f;
    uint8_t u[32];
    double r2 = 0.0;
    for (int k = 0; k < 32; k++) {
        const int v = hi > lo ? (int)lrint((double)(q[k] - lo) * 15.0 / (hi - lo)) : 0;
        u[k] = (uint8_t)v;
        const double r = (double)d * q[k] - ((double)*s * v + (double)*m);
        r2 += r * r;
    }
    rp_nibbles(u, nib);
    return r2;
}

/* super-block sb of a Q6_K column's values v -> the copy's SK_Q4_K nibbles, scales (d, dmin, 8 scales,
 * 8 mins; sk_dequant.h) and values; each block of 32 between min(its smallest, 0) and its largest, the
 * 6-bit scale and min rounded up so the 16 levels cover the block */
static void h4_superblock(const float *v, uint8_t *nib, float *sc, float *out) {
    float span[8], low[8], smax = 0.0f, mmax = 0.0f;
    for (int j = 0; j < 8; j++) {
        float lo = 0.0f, hi = v[32 * j];
        for (int k = 0; k < 32; k++) lo = v[32 * j + k] < lo ? v[32 * j + k] : lo, hi = v[32 * j + k] > hi ? v[32 * j + k] : hi;
        span[j] = (hi - lo) / 15.0f, low[j] = -lo;
        smax = span[j] > smax ? span[j] : smax, mmax = low[j] > mmax ? low[j] : mmax;
    }
    const float d = smax / 63.0f, dmin = mmax / 63.0f;
    uint8_t *u = (uint8_t *)(sc + 2);
    sc[0] = d, sc[1] = dmin;
    for (int j = 0; j < 8; j++) {
        const int us = d > 0.0f ? (int)ceilf(span[j] / d) : 0, um = dmin > 0.0f ? (int)ceilf(low[j] / dmin) : 0;
        u[j] = (uint8_t)(us > 63 ? 63 : us), u[8 + j] = (uint8_t)(um > 63 ? 63 : um);
        const float s0 = d * (float)u[j], s1 = -(dmin * (float)u[8 + j]); /* as q4k_scale reads them */
        uint8_t q[32];
        for (int k = 0; k < 32; k++) {
            const long r = s0 > 0.0f ? lrintf((v[32 * j + k] - s1) / s0) : 0;
            q[k] = (uint8_t)(r < 0 ? 0 : r > 15 ? 15 : r);
            out[32 * j + k] = s0 * (float)q[k] + s1;
        }
        rp_nibbles(q, nib + 16 * j);
    }
}

/* the copy of a Q6_K head: SK_Q4_K (152 bytes a super-block of 256 against 216), each column's values
 * re-quantized by h4_superblock. The 1.5B's head (151,936 columns of 1,536 Q6_K values, 197 of a
 * batch-1 step's ~1,050 MB) against 54 final hidden states of greedy translations (float64): the
 * largest |e_c| / (sigma_c ||x||) of 8.2 M pairs was 5.2, and the rule below kept 3 columns a row on
 * average (19 at most). */
static int h4_prepare_q6k(const sk_w *w, uint8_t *qs, float *sc, float *sigma, int c0, int c1) {
    const int NS = w->k / 256;
    float *v = malloc((size_t)w->k * 8);
    if (!v) return -1;
    float *out = v + w->k;
    for (int c = c0; c < c1; c++) {
        dq_row(w, c, v);
        double r2 = 0.0;
        for (int sb = 0; sb < NS; sb++) {
            const size_t b = (size_t)c * NS + sb;
            h4_superblock(v + 256 * sb, qs + 128 * b, sc + 6 * b, out + 256 * sb);
        }
        for (int k = 0; k < w->k; k++) r2 += ((double)v[k] - out[k]) * ((double)v[k] - out[k]);
        sigma[c] = (float)sqrt(r2 / w->k);
    }
    free(v);
    return 0;
}

/* the copy of a Q8_0 head: each block's integers re-quantized by h4_block */
static int h4_prepare_q8(const sk_w *w, uint8_t *qs, float *sc, float *sigma, int c0, int c1) {
    const int NB = w->k / 32;
    for (int c = c0; c < c1; c++) {
        double r2 = 0.0;
        for (int kb = 0; kb < NB; kb++) {
            const size_t b = (size_t)c * NB + kb;
            r2 += h4_block((const int8_t *)w->qs + 32 * b, w->sc[b], qs + 16 * b, sc + 2 * b, sc + 2 * b + 1);
        }
        sigma[c] = (float)sqrt(r2 / w->k);
    }
    return 0;
}

typedef struct {
    const sk_w *w;
    uint8_t *qs;
    float *sc, *sigma;
    _Atomic int failed;
} h4_prepare_args;

/* this thread's share of the copy's columns (the 1.5B's, with a row's pick: 0.81 s on one thread, 0.42-0.48 on two) */
static void h4_prepare_job(void *p, sk_team *t) {
    h4_prepare_args *a = p;
    int c0, c1;
    team_span(t, a->w->n, &c0, &c1);
    if ((a->w->fmt == SK_Q6_K ? h4_prepare_q6k : h4_prepare_q8)(a->w, a->qs, a->sc, a->sigma, c0, c1))
        atomic_store(&a->failed, 1);
}

/* the copy of a Q8_0 or Q6_K head (w.qs NULL where the format is another or memory ran out), made on
 * nt threads: 4 bits a value in either layout, scales 8 bytes a block of 32 (Q4_1) or 24 a
 * super-block of 256 (Q4_K) */
static h4_head h4_prepare(const sk_w *w, int nt) {
    const int q6k = w->fmt == SK_Q6_K;
    h4_head h = {{q6k ? SK_Q4_K : SK_Q4_1, w->n, w->k, NULL, NULL}, NULL};
    if (!h4_format(w)) return h;
    const size_t values = (size_t)w->n * w->k;
    h4_prepare_args a = {w, stream_alloc(values / 2), stream_alloc(q6k ? values / 256 * 24 : values / 32 * 8),
                         aligned_alloc(64, ((size_t)w->n * 4 + 63) / 64 * 64), 0};
    if (a.qs && a.sc && a.sigma) pool_run(h4_prepare_job, &a, nt);
    if (!a.qs || !a.sc || !a.sigma || atomic_load(&a.failed)) {
        free(a.qs); free(a.sc); free(a.sigma);
        return h;
    }
    h.w.qs = a.qs, h.w.sc = a.sc, h.sigma = a.sigma;
    return h;
}

/* the rule's margin for row x: H4_SIGMAS ||x|| (times sigma_c a column) */
INLINE v16 h4_margin(const float *x, int K) {
    double ss = 0.0;
    for (int k = 0; k < K; k++) ss += (double)x[k] * x[k];
    return v16_set1(H4_SIGMAS * (float)sqrt(ss));
}

/* the bar of columns [c0, c1) (multiples of 16): the largest a_c - margin sigma_c, -inf where none is
 * finite (v16_max keeps its second operand against a NaN) */
static float h4_bar(const h4_head *h, const float *a, v16 margin, int c0, int c1) {
    v16 lower = v16_set1(-INFINITY);
    for (int c = c0; c < c1; c += 16)
        lower = v16_max(v16_sub(v16_load(a + c), v16_mul(margin, v16_load(h->sigma + c))), lower);
    return v16_hmax(lower);
}

/* the columns of [c0, c1) that the rule keeps against `bar` computed exactly, into the best so far
 * (gh_better); every column where bar is -inf (no finite candidate) */
static void h4_exact(const sk_w *w, const h4_head *h, const float *a, const float *x, v16 margin, float bar, int c0,
                     int c1, float *tmp, int *best, float *best_v) {
    if (bar == -INFINITY) {
        for (int c = c0; c < c1; c++) gh_better(c, gh_exact(w, c, x, tmp), best, best_v);
        return;
    }
    const v16 vbar = v16_set1(bar);
    for (int c = c0; c < c1; c += 16) {
        int mask = v16_ge_mask(v16_fmadd(margin, v16_load(h->sigma + c), v16_load(a + c)), vbar);
        for (; mask; mask &= mask - 1) {
            const int j = c + __builtin_ctz(mask);
            gh_better(j, gh_exact(w, j, x, tmp), best, best_v);
        }
    }
}

/* a row's token from a [n], the copy's logits of x: every column the rule above keeps, exactly
 * (where no kept column's exact logit is a number, every column) */
static int h4_pick(const sk_w *w, const h4_head *h, const float *a, const float *x, float *tmp) {
    const v16 margin = h4_margin(x, w->k);
    int best = -1;
    float best_v = 0.0f;
    h4_exact(w, h, a, x, margin, h4_bar(h, a, margin, 0, w->n), 0, w->n, tmp, &best, &best_v);
    if (best < 0) h4_exact(w, h, a, x, margin, -INFINITY, 0, w->n, tmp, &best, &best_v);
    return best;
}

/* each thread's part of h4_pick_team: its span's bar, then its best column and that column's logit */
static struct {
    _Alignas(64) float bar, best_v;
    int best;
} g_h4_part[SK_MAX_THREADS];

/* h4_pick of one row by the whole team, each thread a span of the columns: their bars, a barrier,
 * the kept columns of its span exactly, a barrier, the best of the threads' best. At batch 1 one
 * thread picked while the other waited for it at the step's end (SmolLM2: ~80,000 cycles a step,
 * 1.4 %). Returns the token on thread 0 (-1 on the others). */
static int h4_pick_team(const sk_w *w, const h4_head *h, const float *a, const float *x, float *tmp, sk_team *t) {
    const v16 margin = h4_margin(x, w->k);
    int c0, c1;
    team_span(t, w->n / 16, &c0, &c1);
    c0 *= 16, c1 *= 16;
    g_h4_part[t->tid].bar = h4_bar(h, a, margin, c0, c1);
    team_barrier(t);
    float bar = -INFINITY;
    for (int i = 0; i < t->nt; i++) bar = g_h4_part[i].bar > bar ? g_h4_part[i].bar : bar;
    int best = -1;
    float best_v = 0.0f;
    h4_exact(w, h, a, x, margin, bar, c0, c1, tmp, &best, &best_v);
    g_h4_part[t->tid].best = best;
    g_h4_part[t->tid].best_v = best_v;
    team_barrier(t);
    if (t->tid) return -1;
    best = -1;
    for (int i = 0; i < t->nt; i++) /* spans in column order: the first column on a tie */
        if (g_h4_part[i].best >= 0) gh_better(g_h4_part[i].best, g_h4_part[i].best_v, &best, &best_v);
    if (best < 0) h4_exact(w, h, a, x, margin, -INFINITY, 0, w->n, tmp, &best, &best_v);
    return best;
}

#endif
