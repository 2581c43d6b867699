/* The LM head of greedy steps: the index of each row's largest logit without every logit exact.
 *
 * A batched step's head (SmolLM2: 49152 x 576, Q8_0) is about a seventh of a 16-row step on avx2,
 * and a greedy step needs one number of each row. So the head runs twice as cheap first: activations as ONE int8
 * term a block of 32 (llama.cpp's scheme, too coarse on its own for the greedy gate: 6 of 20 prompts
 * in an emulation, docs/engine.md), the Q8_0 weights straight from the file, vpdpbusd on ymm (8 rows
 * a vector, 64 multiply-adds an instruction against vpdpwssd's 32, no strip; the AVX-512 builds put
 * two such tiles in a zmm, gh_cols16: 16-row steps 1.02-1.05x, 32 rows 1.04-1.06x). Beside each
 * approximate logit a_c it sums a bound e_c on its error: x_k = dx * qx_k + r_k with |r_k| <= dx / 2,
 * so |a_c - exact_c| <= sum_blocks dx / 2 * sum_k |w_ck| (the sums of |w| precomputed per column and
 * block). The largest logit can only be a column with a_c + e_c >= max_j (a_j - e_j); those few
 * (SmolLM2 decode: 3.8 on average, 38 at most over 1004 rows) are computed in fp32 from the
 * dequantized weights and the fp32 row, and the largest of them (the first, on a tie) is the token.
 * That is the argmax of the fp32 head, whatever the approximation's error, and the same for a row
 * whatever else is in the step.
 *
 * The bound is widened by 1/64 for the fp32 rounding of a and of the exact dot products (each well
 * below 1/1000 of e: their terms sum to at most 255 e). A row with a NaN, or with more columns left
 * than a thread keeps (all logits tied), falls back to the exact dot product of every column.
 *
 * Layouts: x in tiles of 8 rows, [tile][K/32][8 groups of 4 k][8 rows] u8 dwords (qx + 128, for
 * vpdpbusd's unsigned operand) with dx [tile][K/32][8]; so sum_k (qx_k + 128) w_k needs
 * 128 * sum_k w_k taken off, precomputed per column and block as well (gh_prep). Included by
 * sk_kernels.c only, after sk_gemv.h (amax_n, quant32) and sk_pool.h. */
#ifndef SK_GREEDY_H
#define SK_GREEDY_H

#if SK_VNNI256 || SK_HAS_VNNI
#define SK_GREEDY 1
INLINE __m256i gh_dpbusd(__m256i acc, __m256i u, __m256i s) {
#if SK_VNNI256
    return _mm256_dpbusd_avx_epi32(acc, u, s);
#else
    return _mm256_dpbusd_epi32(acc, u, s);
#endif
}
#else
#define SK_GREEDY 0
#endif

/* From this many rows the greedy head takes a step: its tile of 8 rows costs the same for 1 row as
 * for 8. `streamkit bench step --argmax`, SmolLM2, whole steps against the logits and a scan
 * (Intel Xeon, 2026-12-06, avx2 / amx): 2 rows 0.93 / 0.95, 3 rows 0.97 / 0.98, 4 rows 1.01 /
 * 1.02, 5 rows 1.04 / 1.12, 8 rows 1.04 / 1.11, 16 rows 1.07 / 1.08. */
#define SK_GREEDY_MIN_ROWS 5
#define GH_WIDEN (1.0f + 1.0f / 64.0f)

/* per column and block of a head: 128 * sum_k q_k (int), and dx-free half error sums
 * 0.5 * d * sum_k |q_k| * GH_WIDEN */
typedef struct {
    int32_t *corr;
    float *err;
} gh_prep;

INLINE int gh_format(const sk_w *w) { return SK_GREEDY && w->fmt == SK_Q8_0 && w->n % 16 == 0; }

/* NULL fields where the head's format is not one this path reads */
static gh_prep gh_prepare(const sk_w *w) {
    gh_prep p = {NULL, NULL};
    if (!gh_format(w)) return p;
    const size_t nb = (size_t)w->n * (w->k / 32);
    p.corr = stream_alloc(nb * 4);
    p.err = stream_alloc(nb * 4);
    if (!p.corr || !p.err) {
        free(p.corr); free(p.err);
        p.corr = NULL; p.err = NULL;
        return p;
    }
    for (size_t b = 0; b < nb; b++) {
        const int8_t *q = (const int8_t *)w->qs + 32 * b;
        int sum = 0, sum_abs = 0;
        for (int k = 0; k < 32; k++) sum += q[k], sum_abs += q[k] < 0 ? -q[k] : q[k];
        p.corr[b] = 128 * sum;
        p.err[b] = 0.5f * fabsf(w->sc[b]) * (float)sum_abs * GH_WIDEN; /* a file may store d < 0 */
    }
    return p;
}

static void gh_free(gh_prep *p) {
    free(p->corr); free(p->err);
    p->corr = NULL; p->err = NULL;
}

/* column c's logit in fp32: the dequantized weights (exact in fp32) dotted with x in a fixed order */
static float gh_exact(const sk_w *w, int c, const float *x, float *tmp) {
    dq_row(w, c, tmp);
    v16 acc = v16_zero();
    for (int k = 0; k < w->k; k += 16) acc = v16_fmadd(v16_load(tmp + k), v16_load(x + k), acc);
    return v16_hsum(acc);
}

/* the better of (c, v) and the best so far: the larger exact logit, the first column on a tie; NaN never */
INLINE void gh_better(int c, float v, int *best, float *best_v) {
    if (v == v && (*best < 0 || v > *best_v || (v == *best_v && c < *best))) *best = c, *best_v = v;
}

/* bytes of the packed x of M rows of K inputs */
static size_t gh_x_bytes(int M, int K) { return (size_t)((M + 7) / 8) * (K / 32) * (256 + 32); }

#if SK_GREEDY
/* x [M][K] -> the tiles above, this thread's share of (tile, block) units */
static void gh_pack_x_team(const float *x, int ldx, int M, int K, uint32_t *xq, float *dx, sk_team *t) {
    const int NB = K / 32, MT = (M + 7) / 8;
    int j0, j1;
    team_span(t, MT * NB, &j0, &j1);
    for (int j = j0; j < j1; j++) {
        const int mt = j / NB, kb = j % NB;
        uint32_t *tile = xq + (size_t)j * 64;
        for (int m = 0; m < 8; m++) {
            const int row = mt * 8 + m;
            if (row >= M) { /* padding rows: qx = 0, dx = 0 */
                for (int g = 0; g < 8; g++) tile[g * 8 + m] = 0x80808080u;
                dx[(size_t)j * 8 + m] = 0.0f;
                continue;
            }
            float v[32] __attribute__((aligned(32)));
            memcpy(v, x + (size_t)row * ldx + kb * 32, sizeof v);
            const float amax = amax_n(v, 32);
            const float d = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
            uint32_t q[8];
            int s_lo, s_hi;
            quant32(v, d, id, (int8_t *)q, (int8_t *)q + 16, &s_lo, &s_hi);
            for (int g = 0; g < 8; g++) tile[g * 8 + m] = q[g] ^ 0x80808080u;
            dx[(size_t)j * 8 + m] = d;
        }
    }
}

/* The scans prefetch the same columns of the next strip (a share is taken in order, sk_pool.h):
 * its per-block scales and sums once, then block by block its weights */
INLINE void gh_prefetch_sums(const sk_w *w, const gh_prep *p, int n, int cols, int NB) {
    for (int c = 0; c < cols; c++) {
        const size_t b = (size_t)(n + 16 + c) * NB;
        prefetch(w->sc + b); prefetch(p->corr + b); prefetch(p->err + b);
        prefetch(w->sc + b + 15); prefetch(p->corr + b + 15); prefetch(p->err + b + 15);
    }
}

INLINE void gh_prefetch_block(const sk_w *w, size_t b0, int cols, int NB) {
    for (int c = 0; c < cols; c++) prefetch(w->qs + 32 * (b0 + (size_t)(16 + c) * NB));
}

/* columns n..n+3 over one or two 8-row tiles (xb = xa when one): approximations into at[c * 16 + row]
 * and bounds into et (rows 8..15 from xb). 4 columns x 2 tiles: 8 vpdpbusd chains. */
INLINE void gh_cols(const sk_w *w, const gh_prep *p, int n, int NB, const uint32_t *xa, const uint32_t *xb,
                    const float *da, const float *db, float *at, float *et, int two_tiles) {
    for (int i = 0; i < 4 * 16; i += 8) {
        _mm256_storeu_ps(at + i, _mm256_setzero_ps());
        _mm256_storeu_ps(et + i, _mm256_setzero_ps());
    }
    gh_prefetch_sums(w, p, n, 4, NB);
    for (int kb = 0; kb < NB; kb++) {
        const uint32_t *ka = xa + (size_t)kb * 64, *kb2 = xb + (size_t)kb * 64;
        const size_t b0 = (size_t)n * NB + kb;
        gh_prefetch_block(w, b0, 4, NB);
        __m256i acc[4][2];
        for (int c = 0; c < 4; c++) acc[c][0] = acc[c][1] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int g = 0; g < 8; g++) {
            const __m256i x0 = _mm256_loadu_si256((const __m256i *)(ka + g * 8));
            const __m256i x1 = two_tiles ? _mm256_loadu_si256((const __m256i *)(kb2 + g * 8)) : x0;
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
                int32_t wq;
                memcpy(&wq, w->qs + 32 * (b0 + (size_t)c * NB) + 4 * g, 4);
                const __m256i wb = _mm256_set1_epi32(wq);
                acc[c][0] = gh_dpbusd(acc[c][0], x0, wb);
                if (two_tiles) acc[c][1] = gh_dpbusd(acc[c][1], x1, wb);
            }
        }
        const __m256 d0 = _mm256_loadu_ps(da + (size_t)kb * 8), d1 = _mm256_loadu_ps(db + (size_t)kb * 8);
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            const size_t b = b0 + (size_t)c * NB;
            const __m256i cv = _mm256_set1_epi32(p->corr[b]);
            const __m256 s = _mm256_set1_ps(w->sc[b]), e = _mm256_set1_ps(p->err[b]);
            for (int h = 0; h < 1 + two_tiles; h++) {
                const __m256 d = h ? d1 : d0;
                float *a = at + c * 16 + h * 8, *eo = et + c * 16 + h * 8;
                const __m256 v = _mm256_cvtepi32_ps(_mm256_sub_epi32(acc[c][h], cv));
                _mm256_storeu_ps(a, _mm256_fmadd_ps(v, _mm256_mul_ps(d, s), _mm256_loadu_ps(a)));
                _mm256_storeu_ps(eo, _mm256_fmadd_ps(d, e, _mm256_loadu_ps(eo)));
            }
        }
    }
}

#if SK_HAS_VNNI
/* gh_cols for columns n..n+7 and both tiles at once, 16 rows a zmm (the AVX-512 builds): half the
 * vpdpbusd of two ymm tiles, and the sums stay in registers across blocks (gh_cols, with 16 ymm
 * registers, adds them into at / et every block). Same products and the same order of fp32
 * operations, so the same numbers, in the same layout (columns 0..7). */
INLINE void gh_cols16(const sk_w *w, const gh_prep *p, int n, int NB, const uint32_t *xa, const uint32_t *xb,
                      const float *da, const float *db, float *at, float *et) {
    __m512 a[8], e[8];
    for (int c = 0; c < 8; c++) a[c] = e[c] = _mm512_setzero_ps();
    gh_prefetch_sums(w, p, n, 8, NB);
    for (int kb = 0; kb < NB; kb++) {
        const uint32_t *ka = xa + (size_t)kb * 64, *kb2 = xb + (size_t)kb * 64;
        const size_t b0 = (size_t)n * NB + kb;
        gh_prefetch_block(w, b0, 8, NB);
        __m512i acc[8];
        for (int c = 0; c < 8; c++) acc[c] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int g = 0; g < 8; g++) {
            const __m256i lo = _mm256_loadu_si256((const __m256i *)(ka + g * 8));
            const __m256i hi = _mm256_loadu_si256((const __m256i *)(kb2 + g * 8));
            const __m512i x = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
#pragma GCC unroll 8
            for (int c = 0; c < 8; c++) {
                int32_t wq;
                memcpy(&wq, w->qs + 32 * (b0 + (size_t)c * NB) + 4 * g, 4);
                acc[c] = _mm512_dpbusd_epi32(acc[c], x, _mm512_set1_epi32(wq));
            }
        }
        const __m256d d0 = _mm256_castps_pd(_mm256_loadu_ps(da + (size_t)kb * 8));
        const __m256d d1 = _mm256_castps_pd(_mm256_loadu_ps(db + (size_t)kb * 8));
        const __m512 d = _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(d0), d1, 1));
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++) {
            const size_t b = b0 + (size_t)c * NB;
            const __m512 v = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[c], _mm512_set1_epi32(p->corr[b])));
            a[c] = _mm512_fmadd_ps(v, _mm512_mul_ps(d, _mm512_set1_ps(w->sc[b])), a[c]);
            e[c] = _mm512_fmadd_ps(d, _mm512_set1_ps(p->err[b]), e[c]);
        }
    }
    for (int c = 0; c < 8; c++) {
        _mm512_storeu_ps(at + c * 16, a[c]);
        _mm512_storeu_ps(et + c * 16, e[c]);
    }
}
#define GH_COLS 8 /* columns a pass of the scan */
#else
#define GH_COLS 4
#endif

/* a column that may hold its row's largest logit, and the upper end of its interval */
typedef struct {
    int col;
    float hi;
} gh_cand;

/* One thread's part of the scan's scratch: per row the largest lower end it has seen (rmax), how
 * many candidates it kept (count; cap + 1: more did not fit) and the candidates, cap a row. */
typedef struct {
    float *rmax;
    int *count;
    gh_cand *cand;
    int cap;
} gh_part;

static gh_part gh_part_of(void *scratch, size_t bytes, int M, int tid, int nt) {
    const size_t per = bytes / (size_t)nt / 64 * 64, mp = (size_t)(M + 7) / 8 * 8;
    uint8_t *q = (uint8_t *)scratch + (size_t)tid * per;
    gh_part part = {(float *)q, (int *)(q + mp * 4), (gh_cand *)(q + mp * 8), 0};
    const size_t room = per > mp * 8 ? (per - mp * 8) / ((size_t)M * sizeof(gh_cand)) : 0;
    part.cap = room > (1u << 30) ? 1 << 30 : (int)room;
    return part;
}

INLINE void gh_keep(gh_part *part, int row, int col, float hi) {
    int *n = &part->count[row];
    if (*n < part->cap) part->cand[(size_t)row * part->cap + *n] = (gh_cand){col, hi};
    if (*n <= part->cap) (*n)++;
}

/* the columns of the strips this thread takes (sk_pool.h's share_next; share_begin(t, N / 16) before
 * the pack's barrier) that may hold their row's largest logit: each column's interval against the
 * largest lower end seen so far in its row, so a row keeps the few columns near its top plus those
 * that led on the way */
static void gh_scan_team(const sk_w *w, const gh_prep *p, int M, const uint32_t *xq, const float *dx, gh_part *part,
                         sk_team *t) {
    const int NB = w->k / 32, MT = (M + 7) / 8;
    float at[GH_COLS * 16] __attribute__((aligned(64))), et[GH_COLS * 16] __attribute__((aligned(64)));
    int a0, a1;
    while (share_next(t, 1, 1, &a0, &a1)) {
        const int n0 = a0 * 16;
        for (int c0 = 0; c0 < 16; c0 += GH_COLS) {
            for (int mt = 0; mt < MT; mt += 2) {
                const int two = mt + 1 < MT;
                const float *da = dx + (size_t)mt * NB * 8, *db = da + (size_t)two * NB * 8;
                const uint32_t *xa = xq + (size_t)mt * NB * 64, *xb = xq + (size_t)(mt + two) * NB * 64;
#if SK_HAS_VNNI
                if (two) gh_cols16(w, p, n0 + c0, NB, xa, xb, da, db, at, et);
                else
                    for (int c = 0; c < 8; c += 4)
                        gh_cols(w, p, n0 + c0 + c, NB, xa, xb, da, db, at + c * 16, et + c * 16, 0);
#else
                gh_cols(w, p, n0 + c0, NB, xa, xb, da, db, at, et, two);
#endif
                for (int h = 0; h < 1 + two; h++) {
                    const int r0 = (mt + h) * 8;
                    __m256 rm = _mm256_loadu_ps(part->rmax + r0);
                    for (int c = 0; c < GH_COLS; c++) {
                        const __m256 a = _mm256_loadu_ps(at + c * 16 + h * 8), e = _mm256_loadu_ps(et + c * 16 + h * 8);
                        const __m256 hi = _mm256_add_ps(a, e);
                        rm = _mm256_max_ps(_mm256_sub_ps(a, e), rm); /* a NaN lower end leaves rm as it was */
                        int mask = _mm256_movemask_ps(_mm256_cmp_ps(hi, rm, _CMP_GE_OQ));
                        if (!mask) continue;
                        float h8[8];
                        _mm256_storeu_ps(h8, hi);
                        for (; mask; mask &= mask - 1) {
                            const int j = __builtin_ctz(mask);
                            if (r0 + j < M) gh_keep(part, r0 + j, n0 + c0 + c, h8[j]);
                        }
                    }
                    _mm256_storeu_ps(part->rmax + r0, rm);
                }
            }
        }
    }
}

/* row r's argmax from every thread's candidates: those whose interval reaches the largest lower end,
 * computed exactly; every column exactly where a part overflowed or nothing qualified (NaNs) */
static int gh_pick(const sk_w *w, void *scratch, size_t bytes, int M, int nt, int r, const float *x, float *tmp) {
    float bar = -INFINITY;
    int over = 0, best = -1;
    float best_v = 0.0f;
    for (int tt = 0; tt < nt; tt++) {
        const gh_part q = gh_part_of(scratch, bytes, M, tt, nt);
        bar = q.rmax[r] > bar ? q.rmax[r] : bar;
        over |= q.count[r] > q.cap;
    }
    for (int tt = 0; tt < nt && !over; tt++) {
        const gh_part q = gh_part_of(scratch, bytes, M, tt, nt);
        for (int i = 0; i < q.count[r]; i++) {
            const gh_cand cd = q.cand[(size_t)r * q.cap + i];
            if (cd.hi >= bar) gh_better(cd.col, gh_exact(w, cd.col, x, tmp), &best, &best_v);
        }
    }
    if (best < 0)
        for (int c = 0; c < w->n; c++) gh_better(c, gh_exact(w, c, x, tmp), &best, &best_v);
    return best;
}

/* each of M rows' argmax into tokens (the rows of x [M][K], ldx apart); scratch: `bytes` for the
 * threads' candidates (M * N * 4 leaves each of 2 threads N / 2 a row), xb the packed rows
 * (gh_x_bytes(M, K)) */
static void greedy_head_team(const sk_w *w, const gh_prep *p, int M, const float *x, int ldx, void *scratch,
                             size_t bytes, void *xb, int32_t *tokens, sk_team *t) {
    const int K = w->k, N = w->n;
    uint32_t *xq = xb;
    float *dx = (float *)((uint8_t *)xb + (size_t)((M + 7) / 8) * (K / 32) * 256);
    gh_part part = gh_part_of(scratch, bytes, M, t->tid, t->nt);
    for (int r = 0; r < (M + 7) / 8 * 8; r++) part.rmax[r] = -INFINITY, part.count[r] = 0;
    share_begin(t, N / 16);
    gh_pack_x_team(x, ldx, M, K, xq, dx, t);
    team_barrier(t);
    gh_scan_team(w, p, M, xq, dx, &part, t);
    team_barrier(t);
    float *tmp = strip_buffer((size_t)K * 4);
    int a, b;
    team_span(t, M, &a, &b);
    for (int r = a; r < b; r++) {
        const int tok = gh_pick(w, scratch, bytes, M, t->nt, r, x + (size_t)r * ldx, tmp);
        tokens[r] = tok < 0 ? 0 : tok;
    }
}
#endif

#endif
