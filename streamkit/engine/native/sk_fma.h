/* The fp32 matmul paths (every instruction set): weights dequantized in registers or into an fp32
 * strip, then fp32 FMAs. Exact up to summation order. Included by sk_kernels.c only. */
#ifndef SK_FMA_H
#define SK_FMA_H

/* y[r][n] (+)= x[r] . W[n] for MR rows (<= 4) and NC columns (<= 4) starting at n. */
INLINE void fma_tile(int fmt, int NC, int MR, const sk_w *w, int n, const float *x, int ldx, float *y, int ldy,
                     int acc) {
    vacc a[4][4];
    for (int c = 0; c < NC; c++)
        for (int r = 0; r < MR; r++) a[c][r] = vacc_zero();
    const int nb = w->k / 32;
    for (int kb = 0; kb < nb; kb++) {
        v16 xl[4], xh[4];
        for (int r = 0; r < MR; r++) {
            xl[r] = v16_load(x + (size_t)r * ldx + kb * 32);
            xh[r] = v16_load(x + (size_t)r * ldx + kb * 32 + 16);
        }
        for (int c = 0; c < NC; c++) {
            v16 lo, hi;
            dq_block(fmt, w, n + c, kb, &lo, &hi);
            for (int r = 0; r < MR; r++) a[c][r] = vacc_dot2(a[c][r], xl[r], lo, xh[r], hi);
        }
    }
    for (int c = 0; c < NC; c++)
        for (int r = 0; r < MR; r++) {
            const float s = vacc_hsum(a[c][r]);
            float *o = y + (size_t)r * ldy + n + c;
            *o = acc ? *o + s : s;
        }
}

/* columns per tile: 4 (16 accumulators of 4 x 4 fit AVX-512's 32 registers; AVX2 has 16, so 2
 * columns once there are 3 or more rows) */
#ifdef __AVX512F__
#define SK_NC(MR) 4
#else
#define SK_NC(MR) ((MR) <= 2 ? 4 : 2)
#endif

#define FMA_CASE(F, MR)                                                                   \
    do {                                                                                  \
        for (; c + SK_NC(MR) <= c1; c += SK_NC(MR)) {                                     \
            if (c + ahead < c1) prefetch_rows(w, c + ahead, SK_NC(MR));                   \
            fma_tile(F, SK_NC(MR), MR, w, c, x, ldx, y, ldy, acc);                        \
        }                                                                                 \
        for (; c < c1; c++) fma_tile(F, 1, MR, w, c, x, ldx, y, ldy, acc);                \
    } while (0)

#define FMA_ROWS(F)                                 \
    switch (mr) {                                   \
    case 1: FMA_CASE(F, 1); break;                  \
    case 2: FMA_CASE(F, 2); break;                  \
    case 3: FMA_CASE(F, 3); break;                  \
    default: FMA_CASE(F, 4); break;                 \
    }

/* columns [c0, c1) for mr rows; prefetches SK_PREFETCH_AHEAD bytes down the weight streams */
static void fma_cols(const sk_w *w, int mr, const float *x, int ldx, float *y, int ldy, int acc, int c0, int c1) {
    const int ahead = 4 * (SK_PREFETCH_AHEAD / (w->k / 32 * qs_block_bytes(w->fmt)) / 4 + 1);
    int c = c0;
    switch (w->fmt) {
    case SK_Q4_1: FMA_ROWS(SK_Q4_1); break;
    case SK_Q8_0: FMA_ROWS(SK_Q8_0); break;
    case SK_Q4_0: FMA_ROWS(SK_Q4_0); break;
    case SK_Q4_K: FMA_ROWS(SK_Q4_K); break;
    case SK_Q6_K: FMA_ROWS(SK_Q6_K); break;
    case SK_Q5_K: FMA_ROWS(SK_Q5_K); break;
    case SK_F16: FMA_ROWS(SK_F16); break;
    case SK_BFLOAT16: FMA_ROWS(SK_BFLOAT16); break;
    default: FMA_ROWS(SK_F32); break;
    }
}

/* "team" functions are called by every thread of a pool job, each doing its share; the caller puts
 * the barrier that the next phase needs after them. Shares are static and contiguous: handing out
 * 32-column chunks as threads free up measured 25 % slower at batch 1 (it breaks each thread's
 * sequential weight stream, which the prefetches rely on). */
static void mm_fma_team(const sk_w *w, int M, const float *x, int ldx, float *y, int ldy, int acc, sk_team *t) {
    int g0, g1;
    team_span(t, (w->n + 3) / 4, &g0, &g1); /* groups of 4 columns, so the 4-column tile runs */
    const int c0 = 4 * g0, c1 = 4 * g1 < w->n ? 4 * g1 : w->n;
    for (int r = 0; r < M; r += 4) {
        const int mr = M - r < 4 ? M - r : 4;
        if (c0 < c1) fma_cols(w, mr, x + (size_t)r * ldx, ldx, y + (size_t)r * ldy, ldy, acc, c0, c1);
    }
}

/* Batched fp32 path: each thread dequantizes strips of SK_FSTRIP output columns into fp32 once per
 * step and runs the F32 tiles over every row of x, so a weight is read from memory and
 * dequantized once per step instead of once per 4 rows. The strip holds exactly the values
 * dq_block gives the direct path and the tiles sum in the same order: results are bit-identical
 * to mm_fma_team's (batch-invariant, so native-fp32 can use it too). */
#define SK_FSTRIP 16
static void mm_strip_team(const sk_w *w, int M, const float *x, int ldx, float *y, int ldy, int acc, sk_team *t) {
    const int K = w->k, N = w->n;
    float *buf = strip_buffer((size_t)SK_FSTRIP * K * 4);
    int s0, s1;
    team_span(t, (N + SK_FSTRIP - 1) / SK_FSTRIP, &s0, &s1);
    for (int s = s0; s < s1; s++) {
        const int n0 = s * SK_FSTRIP, cnt = N - n0 < SK_FSTRIP ? N - n0 : SK_FSTRIP;
        for (int c = 0; c < cnt; c++) {
            prefetch_rows(w, n0 + c + SK_STRIP_AHEAD, 1);
            dq_row(w, n0 + c, buf + (size_t)c * K);
        }
        const sk_w strip = {SK_F32, cnt, K, (const uint8_t *)buf, NULL};
        for (int r = 0; r < M; r += 4) {
            const int mr = M - r < 4 ? M - r : 4;
            fma_cols(&strip, mr, x + (size_t)r * ldx, ldx, y + (size_t)r * ldy + n0, ldy, acc, 0, cnt);
        }
    }
}

#endif
