/* The int8 path of steps with few rows (decode at batch 1-8, speculative verifies, a batched step's
 * short last tile) on K-quant weights (Q4_K, Q6_K: 1-8 rows), and of 1-2 rows on the formats with
 * a scale per block (Q4_1, Q4_0, Q8_0; second half of this file), on every instruction set the
 * kernels build for (AVX2 is enough; AVX-512 VNNI fuses a step).
 *
 * llama.cpp's scheme for these formats: activations quantized per super-block of 256 values, the
 * weights' 4- or 6-bit integers multiplied with them in int16 pairs (vpmaddubsw), the super-block's
 * integer sub-block scales applied in int32 (vpmaddwd + add, or vpdpwssd with VNNI) and one fp32
 * multiply per super-block; Q4_K's mins and Q6_K's -32 come from per-16 sums of the activations.
 * Against the fp32 path this does about a third of the instructions per weight, which is what a
 * batch-1 step of the 1.5B was bound by (0.32 of the memory roofline in fp32).
 * The activations are two int8 terms (the second quantizing what the first left), ~15 bits of each
 * value, as the batched int8 path does: one term failed the greedy-agreement gate there (sk_int8.h).
 *
 * x layout, per row (gemv_x_stride bytes): q [2 terms][K] int8, each group of G 32-value blocks
 * (G = 4 on AVX-512, 2 on AVX2: one register of 4-bit weights) stored as the first halves of its
 * blocks, then the second halves (A0..15 B0..15 .. A16..31 B16..31 ..), the order in which a load of
 * the group's nibbles splits into low and high halves by and/shift alone; then d [2][K/256] float;
 * then xs16 [K/16] and xs32 [K/32] float, the sums of 16 and 32 consecutive values as the two terms
 * give them (d0 q0 + d1 q1). Q4_K's mins and Q6_K's -32 need only those sums: they do not depend on
 * the weight's integers, so per column they cost one fp32 FMA per row, not an integer pass per term
 * (which made the epilogue a third of a 2-row step).
 * Included by sk_kernels.c only (after sk_dequant.h). */
#ifndef SK_GEMV_H
#define SK_GEMV_H

#include <math.h>

#define SK_GEMV 64 /* the i8_mask bit: matmuls gemv_takes accepts take this path */
/* Rows up to which this path beats the others: the int8 work grows with every row, the weight
 * stream does not, while the batched kernels cost a whole tile of 16 rows (int16: 8) from the first
 * row. Zen 5, 2 threads, a whole step of the 1.5B (Q4_K / Q6_K) at 3 / 4 rows: fp32 60 / 70 ms
 * against 46 / 56 here (AVX2 forced: 100 / 116 against 62 / 78); at 5 / 6 / 8 rows (2026-12-05)
 * fp32 FMAs (5-7 rows) or the batched int8 tile (8) 99 / 110 / 107 ms against 49 / 56 / 70 here
 * (AVX2 forced, int16 tiles: 146 / - / 170 against 71 / - / 111); at 12 rows the tile and three
 * groups of rows would about tie. The
 * formats with a scale per block, whose fp32 path has no integer scales to apply, tie at 3 rows
 * (SmolLM2 Q4_1: 4.7 vs 4.8; 2 rows 3.9 vs 3.5, AVX2 forced 6.1 vs 4.5). */
#define SK_GEMV_MAX_ROWS 8
#define SK_GEMV_BLOCK_ROWS 2
/* K-quant rows one pass over a column keeps in registers; more rows take further passes over the
 * same column right after, its weights then in L1 */
#define SK_GEMV_GROUP 4
/* K-quant columns prefetch their weights this many bytes ahead of the super-block being multiplied,
 * one super-block at a time: a column's rows lie one after the other, so this is one linear stream.
 * The per-column prefetch the other formats use (sk_dequant.h's prefetch_rows) pulls the whole next
 * column at each column's start: 4.5-6.7 KB at once for the 1.5B's down projection (K = 8960),
 * which then streamed at 32-35 GB/s against gate/up's 46 (Zen 5, 2 threads, 1 row). In-loop, a
 * whole 1.5B step at 2 rows went from 33-34 to 29-33 ms and at 3 rows from 44-46 to 40.6-42 (three
 * alternating runs of `streamkit bench step`); 1024 or 4096 bytes measured no different (on the
 * Intel Xeon 2048 beat 1024, 1536, 4096 and 8192 by 3-14 %). (Past a weight's end the addresses are
 * only hints: prefetcht0 never faults.) */
#define SK_GEMV_AHEAD 2048
/* The formats with a scale per block prefetch the same way, this many bytes of qs ahead of the blocks
 * being multiplied (and their scales as far ahead in the scales' stream). They prefetched a whole
 * column at its start, SK_PREFETCH_AHEAD bytes ahead, until 2026-12-07: `perf` of the 0.5B draft's
 * batch-1 step (Intel Xeon with AMX) put 57 % of the kernel's samples on that burst of prefetches,
 * waiting on the line-fill buffers. In-loop, both builds in one process, steps alternating: the
 * draft's 1 / 2 rows 1.05-1.12x, SmolLM2's 1.01-1.06x, its 16-step greedy bursts 1.08-1.14x (amx,
 * avx512, avx2); 1024 / 2048 / 4096 / 8192 / 16384 bytes ahead ranked 8192 first (2048: 0.96-0.98
 * of it). The K-quants' 2048 measured best there too. */
#define SK_GEMV_BLOCK_AHEAD 8192
/* columns a thread takes at a time from its own share (sk_pool.h's share_next), and from another's
 * once its own is done: each range costs an atomic add and, for K-quants of a large K, a pass over
 * x's chunks of its own; the smaller steals even out a matrix of few columns (SmolLM2's down
 * projection: 576) */
#define SK_GEMV_SHARE 64
#define SK_GEMV_STEAL 16
#ifdef __AVX512F__
#define SK_GEMV_G 4
#else
#define SK_GEMV_G 2
#endif

INLINE int gemv_kquant(int fmt) { return fmt == SK_Q4_K || fmt == SK_Q6_K; }

static size_t gemv_x_stride(int K) {
    return ((size_t)2 * K + (size_t)2 * (K / 256) * 4 + (size_t)(K / 16) * 4 + (size_t)(K / 32) * 4 + 63) / 64 * 64;
}

typedef struct {
    int8_t *q;    /* [2][K] */
    float *d;     /* [2][K/256] */
    float *xs16;  /* [K/16] */
    float *xs32;  /* [K/32] */
} gemv_x;

INLINE gemv_x gemv_row(const uint8_t *xb, int K, int r) {
    uint8_t *p = (uint8_t *)xb + (size_t)r * gemv_x_stride(K);
    float *d = (float *)(p + 2 * (size_t)K);
    const gemv_x g = {(int8_t *)p, d, d + 2 * (K / 256), d + 2 * (K / 256) + K / 16};
    return g;
}

/* the largest |v| of n values (n a multiple of 8) */
INLINE float amax_n(const float *v, int n) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(v + i)));
    const __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    const __m128 g = _mm_max_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_max_ss(g, _mm_movehdup_ps(g)));
}

INLINE int hsum_i32x8(__m256i a) {
    const __m128i s = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    const __m128i h = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    return _mm_cvtsi128_si32(_mm_add_epi32(h, _mm_shuffle_epi32(h, 1)));
}

/* 32 values v -> round(v * id) as int8, values 0..15 to lo and 16..31 to hi, their sums; v <- what
 * the term leaves (v - d * q). The same numbers as lrintf and fp32 arithmetic would give. */
INLINE void quant32(float *v, float d, float id, int8_t *lo, int8_t *hi, int *sum_lo, int *sum_hi) {
    const __m256 vd = _mm256_set1_ps(d), vid = _mm256_set1_ps(id);
    __m256i q[4];
    for (int i = 0; i < 4; i++) {
        const __m256 a = _mm256_loadu_ps(v + 8 * i);
        /* within +-127 (a fixed second-term scale can round to 128: gemv_pack_blocks_team) */
        q[i] = _mm256_max_epi32(_mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(a, vid)), _mm256_set1_epi32(127)),
                                _mm256_set1_epi32(-127));
        _mm256_storeu_ps(v + 8 * i, _mm256_sub_ps(a, _mm256_mul_ps(vd, _mm256_cvtepi32_ps(q[i]))));
    }
    /* packs interleave 128-bit lanes: [q0 0-3, q1 0-3, q2 0-3, q3 0-3 | q0 4-7, ...]; permute back */
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    const __m256i n = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm_storeu_si128((__m128i *)lo, _mm256_castsi256_si128(n));
    _mm_storeu_si128((__m128i *)hi, _mm256_extracti128_si256(n, 1));
    *sum_lo = hsum_i32x8(_mm256_add_epi32(q[0], q[1]));
    *sum_hi = hsum_i32x8(_mm256_add_epi32(q[2], q[3]));
}

/* one term of 256 values v (natural order) into q (group order), its scale and per-16 sums;
 * v <- what it leaves */
static void gemv_quant_term(float *v, int8_t *q, float *d, int16_t *bs) {
    const float amax = amax_n(v, 256);
    const float dd = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
    *d = dd;
    for (int j = 0; j < 8; j++) {
        const int g = j / SK_GEMV_G, blk = j % SK_GEMV_G;
        int8_t *base = q + g * 32 * SK_GEMV_G + blk * 16;
        int s0, s1;
        quant32(v + 32 * j, dd, id, base, base + 16 * SK_GEMV_G, &s0, &s1);
        bs[2 * j] = (int16_t)s0;
        bs[2 * j + 1] = (int16_t)s1;
    }
}

/* x [M][K] -> the layout above in xb, this thread's share of (row, super-block) pairs */
static void gemv_pack_x_team(const float *x, int ldx, int M, int K, uint8_t *xb, sk_team *t) {
    const int NS = K / 256;
    int i0, i1;
    team_span(t, M * NS, &i0, &i1);
    for (int i = i0; i < i1; i++) {
        const int r = i / NS, s = i % NS;
        const gemv_x X = gemv_row(xb, K, r);
        float v[256];
        int16_t bs[2][16];
        memcpy(v, x + (size_t)r * ldx + (size_t)s * 256, sizeof v);
        gemv_quant_term(v, X.q + s * 256, X.d + s, bs[0]);
        gemv_quant_term(v, X.q + K + s * 256, X.d + NS + s, bs[1]);
        const float d0 = X.d[s], d1 = X.d[NS + s];
        for (int h = 0; h < 16; h++) X.xs16[s * 16 + h] = d0 * (float)bs[0][h] + d1 * (float)bs[1][h];
        for (int j = 0; j < 8; j++) X.xs32[s * 8 + j] = X.xs16[s * 16 + 2 * j] + X.xs16[s * 16 + 2 * j + 1];
    }
}

INLINE __m256i lanes4(int a, int b) { return _mm256_setr_epi32(a, a, a, a, b, b, b, b); }

INLINE float sum8(__m256 a) {
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    const __m128 h = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

#ifdef __AVX512F__
/* acc + sums of 4 products of u8 u and s8 x */
INLINE __m512i dot_u8s8(__m512i acc, __m512i u, __m512i x) {
#if SK_HAS_VNNI
    return _mm512_dpbusd_epi32(acc, u, x);
#else
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, x), _mm512_set1_epi16(1)));
#endif
}

/* dot_u8s8 of two register pairs of 4-bit u (see dot256_4bit_pair) */
INLINE __m512i dot_u8s8_4bit_pair(__m512i u0, __m512i x0, __m512i u1, __m512i x1) {
#if SK_HAS_VNNI
    return dot_u8s8(dot_u8s8(_mm512_setzero_si512(), u0, x0), u1, x1);
#else
    return _mm512_madd_epi16(_mm512_add_epi16(_mm512_maddubs_epi16(u0, x0), _mm512_maddubs_epi16(u1, x1)),
                             _mm512_set1_epi16(1));
#endif
}
#endif

/* One register of G blocks (int8 values, int16 pairs, int32 sums) and its float counterpart: the
 * K-quant kernel below is written once against these helpers. */
#ifdef __AVX512F__
typedef __m512i gvi;
typedef __m512 gvf;
INLINE gvi gv_zero(void) { return _mm512_setzero_si512(); }
INLINE gvf gv_fzero(void) { return _mm512_setzero_ps(); }
INLINE gvi gv_load(const void *p) { return _mm512_loadu_si512(p); }
INLINE gvi gv_and(gvi a, gvi b) { return _mm512_and_si512(a, b); }
INLINE gvi gv_or(gvi a, gvi b) { return _mm512_or_si512(a, b); }
INLINE gvi gv_srli16(gvi a, int n) { return _mm512_srli_epi16(a, n); }
INLINE gvi gv_nib(void) { return _mm512_set1_epi8(0x0F); }
INLINE gvi gv_maddubs(gvi u, gvi x) { return _mm512_maddubs_epi16(u, x); }
INLINE gvi gv_madd_acc(gvi acc, gvi p, gvi s) {
#if SK_HAS_VNNI
    return _mm512_dpwssd_epi32(acc, p, s);
#else
    return _mm512_add_epi32(acc, _mm512_madd_epi16(p, s));
#endif
}
INLINE gvf gv_fma_i(gvi i, float s, gvf f) { return _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_set1_ps(s), f); }
INLINE float gv_sum(gvf f) { return _mm512_reduce_add_ps(f); }
/* each dword's low int16 copied into its high half: a dword lane then broadcasts one int16 scale */
INLINE gvi gv_dup16(gvi d32) { return _mm512_or_si512(_mm512_and_si512(d32, _mm512_set1_epi32(0xFFFF)), _mm512_slli_epi32(d32, 16)); }
/* dword lanes 4i..4i+3 <- lane a + i * step of src (i < G) */
INLINE gvi gv_lanes(gvi src, int a, int step) {
    const int b = a + step, c = a + 2 * step, d = a + 3 * step;
    return _mm512_permutexvar_epi32(_mm512_setr_epi32(a, a, a, a, b, b, b, b, c, c, c, c, d, d, d, d), src);
}
/* 8 u8 sub-block scales (Q4_K), one per dword */
INLINE gvi gv_u8_dwords(const uint8_t *u) { return _mm512_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)u)); }
#if SK_HAS_VNNI
INLINE gvi gv_dpbusd(gvi acc, gvi u, gvi x) { return _mm512_dpbusd_epi32(acc, u, x); }
#endif
INLINE gvi gv_add16(gvi a, gvi b) { return _mm512_add_epi16(a, b); }
/* the int16-pair scales of 16 int8 (Q6_K) sub-block scales, one per dword */
INLINE gvi gv_scales_i8(const int8_t *s, int g) {
    (void)g;
    return gv_dup16(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)s)));
}
#else
typedef __m256i gvi;
typedef __m256 gvf;
INLINE gvi gv_zero(void) { return _mm256_setzero_si256(); }
INLINE gvf gv_fzero(void) { return _mm256_setzero_ps(); }
INLINE gvi gv_load(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
INLINE gvi gv_and(gvi a, gvi b) { return _mm256_and_si256(a, b); }
INLINE gvi gv_or(gvi a, gvi b) { return _mm256_or_si256(a, b); }
INLINE gvi gv_srli16(gvi a, int n) { return _mm256_srli_epi16(a, n); }
INLINE gvi gv_nib(void) { return _mm256_set1_epi8(0x0F); }
INLINE gvi gv_maddubs(gvi u, gvi x) { return _mm256_maddubs_epi16(u, x); }
INLINE gvi gv_madd_acc(gvi acc, gvi p, gvi s) {
#if SK_VNNI256
    return _mm256_dpwssd_avx_epi32(acc, p, s);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, s));
#endif
}
INLINE gvf gv_fma_i(gvi i, float s, gvf f) { return _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_set1_ps(s), f); }
INLINE float gv_sum(gvf f) { return sum8(f); }
INLINE gvi gv_dup16(gvi d32) { return _mm256_or_si256(_mm256_and_si256(d32, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(d32, 16)); }
INLINE gvi gv_lanes(gvi src, int a, int step) { return _mm256_permutevar8x32_epi32(src, lanes4(a, a + step)); }
INLINE gvi gv_u8_dwords(const uint8_t *u) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)u)); }
#if SK_VNNI256
INLINE gvi gv_dpbusd(gvi acc, gvi u, gvi x) { return _mm256_dpbusd_avx_epi32(acc, u, x); }
#endif
INLINE gvi gv_add16(gvi a, gvi b) { return _mm256_add_epi16(a, b); }
/* the 4 scales group g's blocks use, from lane 0 */
INLINE gvi gv_scales_i8(const int8_t *s, int g) {
    int v;
    memcpy(&v, s + 4 * g, 4);
    return gv_dup16(_mm256_cvtepi8_epi32(_mm_cvtsi32_si128(v)));
}
#endif

#define GV_DPBUSD (SK_HAS_VNNI || SK_VNNI256) /* vpdpbusd on this build's registers */

/* One Q4_K register pair (lo: values 0-15 of G blocks, hi: 16-31) times the activations at xlo and
 * xhi, for gv_madd_acc with the scales of gv_q4_scales. A block's lo and hi share one scale, so its
 * 8 products a dword are summed before the scale is applied: with VNNI two vpdpbusd give each
 * dword's sum, which fits in its low int16 (8 * 15 * 127), and one vpdpwssd with the scale in that
 * low half (the high half 0) applies it: 3 instructions where maddubs + dpwssd per half took 4.
 * Without VNNI the int16 pairs of both halves are added (2 * 2 * 15 * 127 fits) before one vpmaddwd.
 * The integer sums are the same either way. */
INLINE gvi gv_q4_pair(gvi lo, const int8_t *xlo, gvi hi, const int8_t *xhi) {
#if GV_DPBUSD
    return gv_dpbusd(gv_dpbusd(gv_zero(), lo, gv_load(xlo)), hi, gv_load(xhi));
#else
    return gv_add16(gv_maddubs(lo, gv_load(xlo)), gv_maddubs(hi, gv_load(xhi)));
#endif
}

/* Q4_K's 8 sub-block scales (u8) as gv_q4_pair's multiplier, one per dword: in its low int16 for
 * vpdpbusd's dword sums, in both for vpmaddubsw's int16 pairs */
INLINE gvi gv_q4_scales(const uint8_t *u) {
#if GV_DPBUSD
    return gv_u8_dwords(u);
#else
    return gv_dup16(gv_u8_dwords(u));
#endif
}

/* the 6-bit values of G Q6_K blocks at q (G / 2 pairs of 48 bytes, sk_dequant.h's SK_Q6_K): values
 * 0-15 of each block in lo, 16-31 in hi. A lane of lo or hi is one block's half; its bytes' high bit
 * pairs sit at bits 0-1 (A's values 0-15), 2-3 (B's), 4-5 (A's 16-31) or 6-7 (B's) of the pair's h,
 * broadcast to both lanes of that pair, so one variable shift per lane and a mask put them at
 * bits 4-5. (They were two uint32 per block, spread by scalar loads and byte shuffles: at 1 row the
 * 1.5B's Q6_K down projection ran at 25 GB/s against Q4_K's 48.) */
#ifdef __AVX512F__
INLINE void gv_q6_values(const uint8_t *q, gvi *lo, gvi *hi) {
    const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)q)),
                                         _mm256_loadu_si256((const __m256i *)(q + 48)), 1);
    const __m512i h = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(q + 32)))),
        _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(q + 80))), 1);
    const __m512i m30 = _mm512_set1_epi8(0x30);
    const __m512i up = _mm512_set_epi32(2, 2, 2, 2, 4, 4, 4, 4, 2, 2, 2, 2, 4, 4, 4, 4);
    const __m512i down = _mm512_set_epi32(2, 2, 2, 2, 0, 0, 0, 0, 2, 2, 2, 2, 0, 0, 0, 0);
    *lo = _mm512_or_si512(_mm512_and_si512(v, gv_nib()), _mm512_and_si512(_mm512_sllv_epi32(h, up), m30));
    *hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v, 4), gv_nib()),
                          _mm512_and_si512(_mm512_srlv_epi32(h, down), m30));
}
#else
INLINE void gv_q6_values(const uint8_t *q, gvi *lo, gvi *hi) {
    const __m256i v = _mm256_loadu_si256((const __m256i *)q);
    const __m256i h = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(q + 32)));
    const __m256i m30 = _mm256_set1_epi8(0x30);
    *lo = _mm256_or_si256(_mm256_and_si256(v, gv_nib()),
                          _mm256_and_si256(_mm256_sllv_epi32(h, _mm256_setr_epi32(4, 4, 4, 4, 2, 2, 2, 2)), m30));
    *hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), gv_nib()),
                          _mm256_and_si256(_mm256_srlv_epi32(h, _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2)), m30));
}
#endif

/* A column's sums between the passes of a K-chunked matmul (gemv_col's f and fo of one row). */
typedef struct {
    gvf f;
    __m256 fo;
} gemv_acc;

/* Super-blocks of x a pass over the columns takes. At 3-4 rows a K-quant step is bound by the int8
 * work, and x's rows spill out of L1 where K is large (per row and super-block NT * 256 int8
 * values and 26 floats: the 1.5B's down projection, K 8960, needs 64 KB at 3 rows). Past the budget
 * each pass covers a chunk of K and keeps every column's sums in a buffer between passes; the
 * arithmetic, and so each row's result, is that of one pass. The down projection (Zen 5, 2 threads,
 * all 28 layers) at 3 / 4 rows: Q6_K 7.31 -> 5.07 / 8.49 -> 5.75 ms, Q4_K 6.18 -> 4.55 / 7.24 ->
 * 4.99. The chunks' strided reads cost bandwidth, so 1-2 rows, bound by the weight stream, keep one
 * pass (at 1 row, chunks of 8-16 KB of x made the same matrices 1.3-1.6x slower). On the Intel Xeon
 * (Sapphire Rapids class, 2 MB of L2 a core against Zen 5's 1 MB) chunks cost: a whole 1.5B step at
 * 3 / 4 rows 1.05 / 1.05x faster in one pass (both builds in one process, alternating), and a budget
 * of 40 or 64 KB no better than 24. So only AMD CPUs take chunks (g_gemv_chunks, set by sk_init). */
#define SK_GEMV_X_BUDGET (24 << 10)
static int g_gemv_chunks = 0;
INLINE int gemv_chunk(int MR, int NT, int NS) {
    const int c = SK_GEMV_X_BUDGET / (MR * (NT * 256 + 104));
    return !g_gemv_chunks || MR < 3 || c >= NS ? NS : c < 8 ? 8 : c;
}

/* y[r][n] (+)= x[r] . W[n] for MR rows (<= SK_GEMV_GROUP), W in Q4_K or Q6_K; G blocks a register.
 * Super-blocks [s0, s1) of the column: the sums start from st (unless s0 is 0) and go back to st
 * (unless s1 is the last), for the passes of gemv_chunk. */
INLINE void gemv_col(int fmt, int MR, int NT, const sk_w *w, int n, int s0, int s1, gemv_acc *st, const uint8_t *xb,
                     float *y, int ldy, int acc) {
    const int K = w->k, NS = K / 256, G = SK_GEMV_G;
    const gvi m4 = gv_nib();
    gemv_x X[SK_GEMV_GROUP];
    gvf f[SK_GEMV_GROUP];
    __m256 fo[SK_GEMV_GROUP]; /* the offset terms (Q4_K's mins, Q6_K's -32), 8 lanes */
    for (int r = 0; r < MR; r++) {
        X[r] = gemv_row(xb, K, r);
        f[r] = s0 ? st[r].f : gv_fzero();
        fo[r] = s0 ? st[r].fo : _mm256_setzero_ps();
    }
    const size_t qsb = fmt == SK_Q4_K ? 128 : 192; /* qs bytes a super-block */
    const int ahead_sb = SK_GEMV_AHEAD / (int)qsb;
    for (int s = s0; s < s1; s++) {
        const float *S = w->sc + (size_t)6 * ((size_t)n * NS + s);
        /* SK_GEMV_AHEAD bytes down the stream this pass reads: past this chunk of the column, the
         * next column's (in one pass, the same addresses as n * NS + s + ahead_sb) */
        const int sa = s + ahead_sb;
        const size_t at = sa < s1 ? (size_t)n * NS + sa : (size_t)(n + 1) * NS + s0 + (sa - s1);
        const char *ahead = (const char *)w->qs + at * qsb + SK_GEMV_AHEAD % qsb;
        for (size_t i = 0; i < qsb; i += 64) prefetch(ahead + i);
        /* the scales' line, once: 24 bytes a super-block, so a prefetch per super-block asked for each
         * line 2.7 times (a 1 / 2-row step of the 1.5B 1.038 / 1.027x once; none at all: 0.99x) */
        if (((uintptr_t)(w->sc + 6 * at) & 63) < 24) prefetch(w->sc + 6 * at);
        gvi ia[SK_GEMV_GROUP][2];
        for (int r = 0; r < MR; r++) ia[r][0] = ia[r][1] = gv_zero();
#pragma GCC unroll 4
        for (int g = 0; g < 8 / G; g++) {
            if (fmt == SK_Q4_K) { /* sc: float d, float dmin, u8 scale[8], u8 min[8] */
                const gvi v = gv_load(w->qs + ((size_t)n * NS + s) * 128 + 16 * G * g);
                const gvi lo = gv_and(v, m4), hi = gv_and(gv_srli16(v, 4), m4);
                const gvi sc = gv_lanes(gv_q4_scales((const uint8_t *)(S + 2)), G * g, 1);
                for (int r = 0; r < MR; r++)
                    for (int t = 0; t < NT; t++) {
                        const int8_t *xq = X[r].q + (size_t)t * K + s * 256 + 32 * G * g;
                        ia[r][t] = gv_madd_acc(ia[r][t], gv_q4_pair(lo, xq, hi, xq + 16 * G), sc);
                    }
            } else { /* SK_Q6_K; sc: float d, 4 unused bytes, int8 scale[16] (one per 16 values) */
                gvi lo, hi;
                gv_q6_values(w->qs + (((size_t)n * NS + s) * 8 + G * g) * 24, &lo, &hi);
                /* block G g + b's halves use scales 2 (G g + b) and 2 (G g + b) + 1 */
                const gvi sc = gv_scales_i8((const int8_t *)(S + 2), g);
                const int first = G == 4 ? 8 * g : 0;
                const gvi sclo = gv_lanes(sc, first, 2), schi = gv_lanes(sc, first + 1, 2);
                for (int r = 0; r < MR; r++)
                    for (int t = 0; t < NT; t++) {
                        const int8_t *xq = X[r].q + (size_t)t * K + s * 256 + 32 * G * g;
                        ia[r][t] = gv_madd_acc(ia[r][t], gv_maddubs(lo, gv_load(xq)), sclo);
                        ia[r][t] = gv_madd_acc(ia[r][t], gv_maddubs(hi, gv_load(xq + 16 * G)), schi);
                    }
            }
        }
        if (fmt == SK_Q4_K) { /* - dmin * sum_j min_j * (sum of block j's x) */
            const __m256 mins = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
                                                  _mm_loadl_epi64((const __m128i *)((const uint8_t *)(S + 2) + 8)))),
                                              _mm256_set1_ps(-S[1]));
            for (int r = 0; r < MR; r++) fo[r] = _mm256_fmadd_ps(mins, _mm256_loadu_ps(X[r].xs32 + s * 8), fo[r]);
        } else { /* the values are q - 32: - 32 d * sum_h scale_h * (sum of those 16 x) */
            const int8_t *sc = (const int8_t *)(S + 2);
            const __m256 m32 = _mm256_set1_ps(-32.0f * S[0]);
            const __m256 c0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)sc))), m32);
            const __m256 c1 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(sc + 8)))), m32);
            for (int r = 0; r < MR; r++) {
                fo[r] = _mm256_fmadd_ps(c0, _mm256_loadu_ps(X[r].xs16 + s * 16), fo[r]);
                fo[r] = _mm256_fmadd_ps(c1, _mm256_loadu_ps(X[r].xs16 + s * 16 + 8), fo[r]);
            }
        }
        for (int r = 0; r < MR; r++)
            for (int t = 0; t < NT; t++) f[r] = gv_fma_i(ia[r][t], S[0] * X[r].d[t * NS + s], f[r]);
    }
    if (s1 < NS) {
        for (int r = 0; r < MR; r++) st[r] = (gemv_acc){f[r], fo[r]};
        return;
    }
    for (int r = 0; r < MR; r++) {
        const float sum = gv_sum(f[r]) + sum8(fo[r]);
        float *o = y + (size_t)r * ldy + n;
        *o = acc ? *o + sum : sum;
    }
}

/* ------------------------------------------------------------------ Q4_1, Q4_0, Q8_0
 * The same for the formats with an fp32 scale per block of 32 (as llama.cpp's Q4_0 x Q8_0): the
 * activations get a scale per block too, so each block's int32 sum is scaled in fp32. Every
 * 4-bit format is "u8 values with a scale and an offset per block" as in sk_int8.h: value = s0 * u + s1,
 * so sum value * x = s0 * dx * sum(u qx) + s1 * dx * sum(qx). Q8_0 multiplies |q| with x carrying
 * q's sign (llama.cpp's trick): q + 128 would overflow vpmaddubsw's int16 pairs.
 * The second activation term's scale is a fixed 1/256 of the first's (what the first leaves is
 * within half its step, so 128 steps of the second; quant32 clamps the rare 128 to 127), so a
 * block's two int32 sums add exactly as (sum1 << 8) + sum2 and take one fp32 conversion, scale and
 * FMA, not one a term (ymm: 16 operations a block pair and row instead of 18). SmolLM2 forwards
 * of 1 / 2 rows (Intel Xeon, 2026-12-06, with the FMA chains below): avx2 1.05 / 1.07x, avx512
 * 1.02-1.04 / 1.06x, amx 1.02 / 1.04x; the same greedy output as the fp32 build on the 20 bench
 * prompts.
 * x layout, per row (gemv_b_stride bytes): q [2][K] int8 (the 4-bit formats in the group order
 * above, a last group of fewer blocks as G = 2; Q8_0 in natural order), dx [2][K/32],
 * sx [K/32] = the block's sum as both terms give it, dx1 * sum(q1) + dx2 * sum(q2): the offset
 * term s1 * sum(x) needs one FMA a block, not one a term. */

INLINE int gemv_block_format(int fmt) { return fmt == SK_Q4_1 || fmt == SK_Q4_0 || fmt == SK_Q8_0; }

/* whether this path takes M rows of w: K-quants up to SK_GEMV_MAX_ROWS rows, the formats with a
 * scale per block up to SK_GEMV_BLOCK_ROWS */
INLINE int gemv_takes(const sk_w *w, int M) {
    if (M < 1) return 0; /* a step with no logit rows: nothing to multiply */
    if (gemv_kquant(w->fmt)) return M <= SK_GEMV_MAX_ROWS && w->k % 256 == 0;
    return M <= SK_GEMV_BLOCK_ROWS && gemv_block_format(w->fmt) && w->k % 64 == 0;
}

static size_t gemv_b_stride(int K) { return ((size_t)2 * K + (size_t)3 * (K / 32) * 4 + 63) / 64 * 64; }

/* One block of 32 values at v in both activation terms: the first's int8 values to lo (values 0-15)
 * and hi (16-31), the second's term_stride bytes further; each term's scale to d[0] and d[1]; the
 * block's sum as both terms give it to sx. The arithmetic of amax_n and quant32 twice, in registers:
 * no copy of v, the residual of the second term (which nothing reads) not computed, one horizontal
 * sum a term (a 576-value row alone: 1116 -> 766 TSC cycles on the Intel Xeon, the same bytes out). */
INLINE void gemv_pack_block(const float *v, int8_t *lo, int8_t *hi, size_t term_stride, float *d, float *sx) {
    const __m256i top = _mm256_set1_epi32(127), bottom = _mm256_set1_epi32(-127);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7); /* packs interleave 128-bit lanes */
    __m256 a[4];
    for (int i = 0; i < 4; i++) a[i] = _mm256_loadu_ps(v + 8 * i);
    const float amax = amax_n(v, 32), d0 = amax / 127.0f;
    const float d1 = d0 / 256.0f; /* a fixed 1/256 of the first's scale (see above) */
    const float id[2] = {amax > 0.0f ? 127.0f / amax : 0.0f, d0 > 0.0f ? 256.0f / d0 : 0.0f};
    float sum = 0.0f;
    for (int term = 0; term < 2; term++) {
        const float dt = term ? d1 : d0;
        const __m256 vid = _mm256_set1_ps(id[term]), vd = _mm256_set1_ps(dt);
        __m256i q[4];
        for (int i = 0; i < 4; i++) {
            q[i] = _mm256_max_epi32(_mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(a[i], vid)), top), bottom);
            if (!term) a[i] = _mm256_sub_ps(a[i], _mm256_mul_ps(vd, _mm256_cvtepi32_ps(q[i])));
        }
        const __m256i n = _mm256_permutevar8x32_epi32(
            _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3])), order);
        _mm_storeu_si128((__m128i *)(lo + term * term_stride), _mm256_castsi256_si128(n));
        _mm_storeu_si128((__m128i *)(hi + term * term_stride), _mm256_extracti128_si256(n, 1));
        const int s = hsum_i32x8(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
        d[term] = dt;
        sum += dt * (float)s;
    }
    *sx = sum;
}

/* blocks [b0, b1) of row r of x (its K values at xr) into the row's packed layout at p
 * (gemv_b_stride bytes a row): the 4-bit formats' group order where grouped, else natural order */
INLINE void gemv_pack_row_blocks(const float *xr, int K, int grouped, uint8_t *p, int b0, int b1) {
    const int NB = K / 32;
    float *dx = (float *)(p + 2 * (size_t)K), *sx = dx + 2 * NB;
    for (int b = b0; b < b1; b++) {
        const int g0 = b - b % SK_GEMV_G, gsz = NB - g0 < SK_GEMV_G ? NB - g0 : SK_GEMV_G;
        int8_t *lo = (int8_t *)p + (grouped ? g0 * 32 + (b - g0) * 16 : b * 32);
        float d[2];
        gemv_pack_block(xr + (size_t)b * 32, lo, lo + (grouped ? 16 * gsz : 16), (size_t)K, d, sx + b);
        dx[b] = d[0];
        dx[NB + b] = d[1];
    }
}

static void gemv_pack_blocks_team(const float *x, int ldx, int M, int K, int grouped, uint8_t *xb, sk_team *t) {
    const int NB = K / 32;
    int i0, i1;
    team_span(t, M * NB, &i0, &i1);
    for (int r = i0 / NB; r * NB < i1; r++) {
        const int b0 = r * NB > i0 ? 0 : i0 - r * NB, b1 = (r + 1) * NB < i1 ? NB : i1 - r * NB;
        gemv_pack_row_blocks(x + (size_t)r * ldx, K, grouped, xb + (size_t)r * gemv_b_stride(K), b0, b1);
    }
}

/* lanes 0..n-1 of p (n = 2 or 4), the rest zero */
INLINE __m128 load_n(const float *p, int n) {
    return n == 4 ? _mm_loadu_ps(p) : _mm_castpd_ps(_mm_load_sd((const double *)p));
}

/* (s0, s1) of n (2 or 4) consecutive blocks from b */
INLINE void block_scales(int fmt, const sk_w *w, size_t b, int n, __m128 *s0, __m128 *s1) {
    if (fmt == SK_Q8_0) {
        *s0 = load_n(w->sc + b, n);
        *s1 = _mm_setzero_ps();
    } else {
        const __m128 a = _mm_loadu_ps(w->sc + 2 * b), c = n == 4 ? _mm_loadu_ps(w->sc + 2 * b + 4) : _mm_setzero_ps();
        *s0 = _mm_shuffle_ps(a, c, _MM_SHUFFLE(2, 0, 2, 0)); /* d m d m | d m d m */
        *s1 = fmt == SK_Q4_0 ? _mm_mul_ps(*s0, _mm_set1_ps(-8.0f)) : _mm_shuffle_ps(a, c, _MM_SHUFFLE(3, 1, 3, 1));
    }
}

INLINE __m256i dot256(__m256i acc, __m256i u, __m256i x) {
#if SK_HAS_VNNI
    return _mm256_dpbusd_epi32(acc, u, x);
#elif SK_VNNI256
    return _mm256_dpbusd_avx_epi32(acc, u, x);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1)));
#endif
}

/* dot256 of two register pairs of 4-bit u: without VNNI the int16 pairs of both products are added
 * before one widening (|u x + u x| <= 2 * 15 * 127, twice that still fits in int16), so a block pair
 * costs 3 multiplies, not 4 */
INLINE __m256i dot256_4bit_pair(__m256i u0, __m256i x0, __m256i u1, __m256i x1) {
#if SK_HAS_VNNI || SK_VNNI256
    return dot256(dot256(_mm256_setzero_si256(), u0, x0), u1, x1);
#else
    return _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(u0, x0), _mm256_maddubs_epi16(u1, x1)),
                             _mm256_set1_epi16(1));
#endif
}

/* Each row sums into GEMV_ACC registers: a single register made the loop one chain of FMA
 * latencies, which bounded the avx2 path's batch-1 step (Q8_0: 4 FMAs of 4 cycles per 64 weights).
 * Block pairs alternate between slot 0 and 1 (Q8_0, one FMA a block: 0-1 and 2-3; gemv_pairs); the AVX-512
 * loop's 4 blocks an iteration take slot 0 (Q8_0: 0-1) of its own registers. */
#define GEMV_ACC 4

/* a block's sums of the two activation terms as one: the second's scale is 1/256 of the first's */
INLINE __m256i term2(__m256i first, __m256i second) { return _mm256_add_epi32(_mm256_slli_epi32(first, 8), second); }

#ifdef __AVX512F__
INLINE __m512i term2_512(__m512i first, __m512i second) { return _mm512_add_epi32(_mm512_slli_epi32(first, 8), second); }

/* a group's activations at p: 4 blocks' halves (64 bytes), or a last group of 2 (32 bytes, upper half 0) */
INLINE __m512i gemv_group_x(const int8_t *p, int two_blocks) {
    return two_blocks ? _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)p))
                      : _mm512_loadu_si512((const void *)p);
}

/* a group of 4-bit weights (u0: its blocks' first halves, u1: second) times its activations at xq, NT
 * terms (the second K bytes further) summed as term2_512: each block's integer sum in its 4 lanes */
INLINE __m512i gemv_4bit_group(__m512i u0, __m512i u1, const int8_t *xq, int K, int NT, int two_blocks) {
    const int half = two_blocks ? 32 : 64;
    __m512i i = dot_u8s8_4bit_pair(u0, gemv_group_x(xq, two_blocks), u1, gemv_group_x(xq + half, two_blocks));
    if (NT == 2)
        i = term2_512(i, dot_u8s8_4bit_pair(u0, gemv_group_x(xq + K, two_blocks), u1,
                                            gemv_group_x(xq + K + half, two_blocks)));
    return i;
}
#endif

/* the lines SK_GEMV_BLOCK_AHEAD bytes down the qs and scales streams of `blocks` blocks from gb (a
 * column's block index into the whole weight: the streams run on into the next columns) */
INLINE void gemv_pf_blocks(int fmt, const sk_w *w, size_t gb, int blocks) {
    const size_t qb = (size_t)qs_block_bytes(fmt), sb = (size_t)sc_block_bytes(fmt);
    const char *q = (const char *)w->qs + gb * qb + SK_GEMV_BLOCK_AHEAD;
    for (size_t i = 0; i < blocks * qb; i += 64) prefetch(q + i);
    const char *s = (const char *)w->sc + gb * sb + SK_GEMV_BLOCK_AHEAD / qb * sb;
    if (((uintptr_t)s & 63) < blocks * sb) prefetch(s); /* once a line: where these blocks start it */
}

/* `pairs` (1 or 2, a constant) pairs of blocks from b of column n, 256 bits wide: f[r][] += the
 * products, o[r] += the offsets. Two pairs share one load and conversion of their scales, one scaling
 * of the activations' scales and one offset FMA a row; pair p sums into slot p (Q8_0: 2p, 2p + 1). */
INLINE void gemv_pairs(int fmt, int MR, int NT, const sk_w *w, int n, int b, const uint8_t *xb,
                       __m256 (*f)[GEMV_ACC], __m128 *o, int pairs) {
    const int K = w->k, NB = K / 32;
    const size_t gb = (size_t)n * NB + b, stride = gemv_b_stride(K);
    __m128 s0, s1;
    block_scales(fmt, w, gb, 2 * pairs, &s0, &s1);
    __m256i u[2][2], sg[2][2];
#pragma GCC unroll 2
    for (int p = 0; p < pairs; p++) {
        if (fmt == SK_Q8_0) {
            for (int j = 0; j < 2; j++) {
                sg[p][j] = _mm256_loadu_si256((const __m256i *)(w->qs + 32 * (gb + 2 * p + j)));
                u[p][j] = _mm256_abs_epi8(sg[p][j]);
            }
        } else {
            const __m256i m4 = _mm256_set1_epi8(0x0F);
            const __m256i v = _mm256_loadu_si256((const __m256i *)(w->qs + 16 * (gb + 2 * p)));
            u[p][0] = _mm256_and_si256(v, m4);
            u[p][1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        }
    }
    for (int r = 0; r < MR; r++) {
        const uint8_t *row = xb + (size_t)r * stride;
        const float *dx = (const float *)(row + 2 * (size_t)K), *sx = dx + 2 * NB;
        /* with two terms, (sum1 << 8) + sum2 counts steps of the second term's scale (term2) */
        const __m256 S = _mm256_castps128_ps256(_mm_mul_ps(s0, load_n(dx + (NT - 1) * NB + b, 2 * pairs)));
#pragma GCC unroll 2
        for (int p = 0; p < pairs; p++) {
            const int8_t *xq = (const int8_t *)row + 32 * (b + 2 * p);
            if (fmt == SK_Q8_0) { /* natural order: one block a register */
                for (int j = 0; j < 2; j++) {
                    const __m256i *x = (const __m256i *)(xq + 32 * j), *x2 = (const __m256i *)(xq + K + 32 * j);
                    const __m256i z = _mm256_setzero_si256();
                    __m256i i = dot256(z, u[p][j], _mm256_sign_epi8(_mm256_loadu_si256(x), sg[p][j]));
                    if (NT == 2) i = term2(i, dot256(z, u[p][j], _mm256_sign_epi8(_mm256_loadu_si256(x2), sg[p][j])));
                    const __m256 Sj = _mm256_permutevar8x32_ps(S, _mm256_set1_epi32(2 * p + j));
                    f[r][2 * p + j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), Sj, f[r][2 * p + j]);
                }
            } else { /* group order: each register holds 16 values of both blocks, 4 lanes each */
                const __m256i *x = (const __m256i *)xq, *x2 = (const __m256i *)(xq + K);
                __m256i i = dot256_4bit_pair(u[p][0], _mm256_loadu_si256(x), u[p][1], _mm256_loadu_si256(x + 1));
                if (NT == 2)
                    i = term2(i, dot256_4bit_pair(u[p][0], _mm256_loadu_si256(x2), u[p][1], _mm256_loadu_si256(x2 + 1)));
                f[r][p] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_permutevar8x32_ps(S, lanes4(2 * p, 2 * p + 1)),
                                          f[r][p]);
            }
        }
        o[r] = _mm_fmadd_ps(s1, load_n(sx + b, 2 * pairs), o[r]);
    }
}

INLINE float sum4(__m128 a) {
    const __m128 h = _mm_add_ps(a, _mm_movehl_ps(a, a));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

/* y[r][n] (+)= x[r] . W[n] for MR rows */
INLINE void gemv_block_col(int fmt, int MR, int NT, const sk_w *w, int n, const uint8_t *xb, float *y, int ldy, int acc) {
    const int NB = w->k / 32;
    __m256 f[SK_GEMV_BLOCK_ROWS][GEMV_ACC];
    __m128 o[SK_GEMV_BLOCK_ROWS];
    for (int r = 0; r < MR; r++) {
        for (int a = 0; a < GEMV_ACC; a++) f[r][a] = _mm256_setzero_ps();
        o[r] = _mm_setzero_ps();
    }
    int b = 0;
#ifdef __AVX512F__
    /* four blocks an iteration */
    const int K = w->k;
    const size_t stride = gemv_b_stride(K);
    const __m512i e4 = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const __m512i e8a = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    const __m512i e8b = _mm512_setr_epi32(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    __m512 F[SK_GEMV_BLOCK_ROWS][GEMV_ACC];
    for (int r = 0; r < MR; r++)
        for (int a = 0; a < GEMV_ACC; a++) F[r][a] = _mm512_setzero_ps();
    for (; b + 4 <= NB; b += 4) {
        const size_t gb = (size_t)n * NB + b;
        gemv_pf_blocks(fmt, w, gb, 4);
        __m128 s0, s1;
        block_scales(fmt, w, gb, 4, &s0, &s1);
        __m512i u0, u1;
        __mmask64 n0 = 0, n1 = 0; /* Q8_0: the negative weights */
        if (fmt == SK_Q8_0) {
            const __m512i q0 = _mm512_loadu_si512((const void *)(w->qs + 32 * gb));
            const __m512i q1 = _mm512_loadu_si512((const void *)(w->qs + 32 * gb + 64));
            n0 = _mm512_movepi8_mask(q0);
            n1 = _mm512_movepi8_mask(q1);
            u0 = _mm512_abs_epi8(q0);
            u1 = _mm512_abs_epi8(q1);
        } else {
            const __m512i m4 = _mm512_set1_epi8(0x0F), v = _mm512_loadu_si512((const void *)(w->qs + 16 * gb));
            u0 = _mm512_and_si512(v, m4);
            u1 = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
        }
        for (int r = 0; r < MR; r++) {
            const uint8_t *p = xb + (size_t)r * stride;
            const float *dx = (const float *)(p + 2 * (size_t)K), *sx = dx + 2 * NB;
            const int8_t *xq = (const int8_t *)p + 32 * b;
            /* with two terms, (sum1 << 8) + sum2 counts steps of the second term's scale (term2_512) */
            const __m512 S = _mm512_castps128_ps512(_mm_mul_ps(s0, _mm_loadu_ps(dx + (NT - 1) * NB + b)));
            if (fmt == SK_Q8_0) {
                const __m512i x0 = _mm512_loadu_si512((const void *)xq), x1 = _mm512_loadu_si512((const void *)(xq + 64));
                const __m512i z = _mm512_setzero_si512();
                __m512i i0 = dot_u8s8(z, u0, _mm512_mask_sub_epi8(x0, n0, z, x0));
                __m512i i1 = dot_u8s8(z, u1, _mm512_mask_sub_epi8(x1, n1, z, x1));
                if (NT == 2) {
                    const __m512i y0 = _mm512_loadu_si512((const void *)(xq + K));
                    const __m512i y1 = _mm512_loadu_si512((const void *)(xq + K + 64));
                    i0 = term2_512(i0, dot_u8s8(z, u0, _mm512_mask_sub_epi8(y0, n0, z, y0)));
                    i1 = term2_512(i1, dot_u8s8(z, u1, _mm512_mask_sub_epi8(y1, n1, z, y1)));
                }
                F[r][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i0), _mm512_permutexvar_ps(e8a, S), F[r][0]);
                F[r][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i1), _mm512_permutexvar_ps(e8b, S), F[r][1]);
            } else {
                const __m512i i = gemv_4bit_group(u0, u1, xq, K, NT, 0);
                F[r][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_permutexvar_ps(e4, S), F[r][0]);
            }
            o[r] = _mm_fmadd_ps(s1, _mm_loadu_ps(sx + b), o[r]);
        }
    }
    if (fmt != SK_Q8_0 && b < NB) { /* the last 2 blocks (K % 64 == 0): the loop's registers, upper halves 0 */
        const size_t gb = (size_t)n * NB + b;
        gemv_pf_blocks(fmt, w, gb, 2);
        __m128 s0, s1;
        block_scales(fmt, w, gb, 2, &s0, &s1);
        const __m512i m4 = _mm512_set1_epi8(0x0F);
        const __m512i v = _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)(w->qs + 16 * gb)));
        const __m512i u0 = _mm512_and_si512(v, m4), u1 = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
        for (int r = 0; r < MR; r++) {
            const uint8_t *p = xb + (size_t)r * stride;
            const float *dx = (const float *)(p + 2 * (size_t)K), *sx = dx + 2 * NB;
            const __m512 S = _mm512_castps128_ps512(_mm_mul_ps(s0, load_n(dx + (NT - 1) * NB + b, 2)));
            const __m512i i = gemv_4bit_group(u0, u1, (const int8_t *)p + 32 * b, K, NT, 1);
            F[r][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_permutexvar_ps(e4, S), F[r][0]);
            o[r] = _mm_fmadd_ps(s1, load_n(sx + b, 2), o[r]);
        }
        b = NB;
    }
#endif
    /* two FMA chains a row (one iteration's latency was the avx2 bound) */
    for (; b + 4 <= NB; b += 4) {
        gemv_pf_blocks(fmt, w, (size_t)n * NB + b, 4);
        gemv_pairs(fmt, MR, NT, w, n, b, xb, f, o, 2);
    }
    for (; b < NB; b += 2) {
        gemv_pf_blocks(fmt, w, (size_t)n * NB + b, 2);
        gemv_pairs(fmt, MR, NT, w, n, b, xb, f, o, 1);
    }
    for (int r = 0; r < MR; r++) {
#ifdef __AVX512F__
        /* the 4-bit formats' sums are all in F[r][0] and o[r]: one reduction */
        float sum = fmt != SK_Q8_0 ? _mm512_reduce_add_ps(_mm512_add_ps(F[r][0], _mm512_zextps128_ps512(o[r])))
                                   : sum8(_mm256_add_ps(f[r][0], f[r][1])) + sum4(o[r]) +
                                         _mm512_reduce_add_ps(_mm512_add_ps(F[r][0], F[r][1]));
#else
        const float sum = sum8(_mm256_add_ps(_mm256_add_ps(f[r][0], f[r][1]), _mm256_add_ps(f[r][2], f[r][3]))) + sum4(o[r]);
#endif
        float *out = y + (size_t)r * ldy + n;
        *out = acc ? *out + sum : sum;
    }
}

/* this thread's columns, MR rows each, NT activation terms: constants, one instantiation of COL each */
/* (each column prefetches its stream ahead in-loop: gemv_pf_blocks, SK_GEMV_AHEAD) */
#define GEMV_COLS(F, MR, NT) for (int c = c0; c < c1; c++) COL(F, MR, NT, w, c, xr, yr, ldy, acc);
/* K-quants: per column, rows 0..A-1 and then A..A+B-1 (B may be 0), in
 * passes over chunks of K where x outgrows L1 (gemv_chunk); A, B and NT constants, so that each
 * gemv_col is compiled for its row count (a loop over groups of rows measured 4-6 % slower at 3-4) */
#define GEMV_KGROUP(F, MR, NT, r0) \
    gemv_col(F, MR, NT, w, c, s0, s1, cs ? cs + (r0) : NULL, xr + (size_t)(r0) * xs, yr + (size_t)(r0) * ldy, ldy, acc)
#define GEMV_KCOLS(F, A, B, NT)                                                                              \
    {                                                                                                        \
        const int NS = w->k / 256, chunk = gemv_chunk(A + B, NT, NS);                                        \
        const size_t xs = gemv_x_stride(w->k);                                                               \
        gemv_acc *st = chunk < NS ? strip_buffer((size_t)(c1 - c0) * (A + B) * sizeof(gemv_acc)) : NULL;    \
        for (int s0 = 0; s0 < NS; s0 += chunk) {                                                             \
            const int s1 = s0 + chunk < NS ? s0 + chunk : NS;                                                \
            for (int c = c0; c < c1; c++) {                                                                  \
                gemv_acc *cs = st ? st + (size_t)(c - c0) * (A + B) : NULL;                                  \
                GEMV_KGROUP(F, A, NT, 0);                                                                    \
                if (B) GEMV_KGROUP(F, B ? B : 1, NT, A);                                                     \
            }                                                                                                \
        }                                                                                                    \
    }
#define GEMV_KQUANT(F, NT)                                                                                   \
    switch (mr) {                                                                                            \
    case 1: GEMV_KCOLS(F, 1, 0, NT) break;                                                                   \
    case 2: GEMV_KCOLS(F, 2, 0, NT) break;                                                                   \
    case 3: GEMV_KCOLS(F, 3, 0, NT) break;                                                                   \
    case 4: GEMV_KCOLS(F, 4, 0, NT) break;                                                                   \
    default: gemv_kquant_wide(w, mr, NT == 2, c0, c1, xr, yr, ldy, acc); break;                              \
    }
#define GEMV_KQUANT_WIDE(F, NT)                                                                              \
    switch (mr) {                                                                                            \
    case 5: GEMV_KCOLS(F, 4, 1, NT) break;                                                                   \
    case 6: GEMV_KCOLS(F, 4, 2, NT) break;                                                                   \
    case 7: GEMV_KCOLS(F, 4, 3, NT) break;                                                                   \
    default: GEMV_KCOLS(F, 4, 4, NT) break;                                                                  \
    }

/* 5-8 rows of a K-quant weight: a function of its own, so that mm_gemv_team's code for 1-4 rows, the
 * usual decode, stays as compiled before (inlined with these cases it ran 1-3 % slower at 3-4 rows) */
__attribute__((noinline)) static void gemv_kquant_wide(const sk_w *w, int mr, int two, int c0, int c1,
                                                        const uint8_t *xr, float *yr, int ldy, int acc) {
    if (w->fmt == SK_Q4_K) {
        if (two) { GEMV_KQUANT_WIDE(SK_Q4_K, 2) } else { GEMV_KQUANT_WIDE(SK_Q4_K, 1) }
    } else {
        if (two) { GEMV_KQUANT_WIDE(SK_Q6_K, 2) } else { GEMV_KQUANT_WIDE(SK_Q6_K, 1) }
    }
}
#define GEMV_BLOCK_ROWS_NT(F, NT) /* up to SK_GEMV_BLOCK_ROWS */                                            \
    switch (mr) {                                                                                            \
    case 1: GEMV_COLS(F, 1, NT) break;                                                                       \
    default: GEMV_COLS(F, 2, NT) break;                                                                      \
    }
#define GEMV_ROWS(F)                                                                                         \
    if (two) { GEMV_KQUANT(F, 2) } else { GEMV_KQUANT(F, 1) }
#define GEMV_BLOCK_ROWS(F)                                                                                   \
    if (two) { GEMV_BLOCK_ROWS_NT(F, 2) } else { GEMV_BLOCK_ROWS_NT(F, 1) }

/* columns [c0, c1) of w for M <= SK_GEMV_MAX_ROWS rows of x packed in xb as w's format reads it
 * (gemv_pack_team). two: both activation terms (else the first only, ~8 bits, llama.cpp's
 * precision: for drafts, whose tokens the target checks, as the batched int8 path's int8_terms = 1). */
static void gemv_columns(const sk_w *w, int M, const uint8_t *xb, float *y, int ldy, int acc, int two, int c0, int c1) {
    const int mr = M;
    const uint8_t *xr = xb;
    float *yr = y;
    switch (w->fmt) {
    case SK_Q4_K: GEMV_ROWS(SK_Q4_K); break;
    case SK_Q6_K: GEMV_ROWS(SK_Q6_K); break;
#define COL gemv_block_col
    case SK_Q4_1: GEMV_BLOCK_ROWS(SK_Q4_1); break;
    case SK_Q4_0: GEMV_BLOCK_ROWS(SK_Q4_0); break;
    default: GEMV_BLOCK_ROWS(SK_Q8_0); break;
#undef COL
    }
}

/* the layouts x is packed in: one for the K-quants, and the block formats' grouped (4-bit) or
 * natural (Q8_0) order */
enum { GEMV_PACK_KQUANT, GEMV_PACK_GROUPED, GEMV_PACK_Q8_0, GEMV_PACKS };
INLINE int gemv_pack_kind(int fmt) {
    return gemv_block_format(fmt) ? (fmt == SK_Q8_0 ? GEMV_PACK_Q8_0 : GEMV_PACK_GROUPED) : GEMV_PACK_KQUANT;
}
static size_t gemv_pack_bytes(int kind, int M, int K) {
    return (size_t)M * (kind == GEMV_PACK_KQUANT ? gemv_x_stride(K) : gemv_b_stride(K));
}

/* x [M][K] packed in layout `kind` into xb, this thread's share of it */
static void gemv_pack_team(int kind, int M, int K, const float *x, int ldx, uint8_t *xb, sk_team *t) {
    if (kind == GEMV_PACK_KQUANT) gemv_pack_x_team(x, ldx, M, K, xb, t);
    else gemv_pack_blocks_team(x, ldx, M, K, kind == GEMV_PACK_GROUPED, xb, t);
}

/* y [M][ldy] (+)= x . W^T for M <= SK_GEMV_MAX_ROWS, reading each weight once; xb (shared by
 * the team) holds the quantized x. Every row's result is the same whatever M is. */
static void mm_gemv_team(const sk_w *w, int M, const float *x, int ldx, uint8_t *xb, float *y, int ldy, int acc,
                         int two, sk_team *t) {
    share_begin(t, (w->n + SK_GEMV_STEAL - 1) / SK_GEMV_STEAL);
    gemv_pack_team(gemv_pack_kind(w->fmt), M, w->k, x, ldx, xb, t);
    team_barrier(t);
    int g0, g1;
    while (share_next(t, SK_GEMV_SHARE / SK_GEMV_STEAL, 1, &g0, &g1)) {
        const int c0 = g0 * SK_GEMV_STEAL, c1 = g1 * SK_GEMV_STEAL < w->n ? g1 * SK_GEMV_STEAL : w->n;
        gemv_columns(w, M, xb, y, ldy, acc, two, c0, c1);
    }
}

/* Values of x (M rows times K) up to which a step's matmul has each thread pack all of x for itself
 * (mm_gemv_own_team) instead of its share and a barrier: what it packs twice must cost less than
 * the barrier's wait. */
#define SK_GEMV_OWN_MAX 2048
static int g_gemv_own_x = 1; /* 0: every matmul packs x as the team's shares (tests compare both) */

/* x packed for a fused matrix's parts, each layout they read once (the offsets in xb: at[kind],
 * SIZE_MAX for a layout no part reads): returns the bytes; *groups: the parts' groups of
 * SK_GEMV_STEAL columns, the share space of gemv_parts_team */
static size_t gemv_parts_layouts(const sk_w *parts, int n_parts, int M, size_t *at, int *groups) {
    size_t bytes = 0;
    for (int k = 0; k < GEMV_PACKS; k++) at[k] = SIZE_MAX;
    *groups = 0;
    for (int j = 0; j < n_parts; j++) {
        const int kind = gemv_pack_kind(parts[j].fmt);
        if (at[kind] == SIZE_MAX) at[kind] = bytes, bytes += gemv_pack_bytes(kind, M, parts[0].k);
        *groups += (parts[j].n + SK_GEMV_STEAL - 1) / SK_GEMV_STEAL;
    }
    return bytes;
}

/* The multiply of a fused matrix's parts (part j's columns after those of parts 0..j-1, in y too),
 * x packed at xb as gemv_parts_layouts laid it out, complete for every thread: the columns of all
 * parts are one share space, this thread's share published (share_begin of their groups). A thread
 * may reach its steals before another has published its share: it then finds that share as the
 * last multiply left it, empty, and leaves it to its owner. Ends with a barrier, as matmul_team. */
static void gemv_parts_team(const sk_w *parts, int n_parts, int M, const uint8_t *xb, const size_t *at, float *y,
                            int ldy, int acc, int two, sk_team *t) {
    int g0, g1;
    while (share_next(t, SK_GEMV_SHARE / SK_GEMV_STEAL, 1, &g0, &g1)) {
        for (int j = 0, first = 0, col = 0; j < n_parts && first < g1; col += parts[j].n, j++) {
            const int ng = (parts[j].n + SK_GEMV_STEAL - 1) / SK_GEMV_STEAL, a = g0 > first ? g0 : first,
                      b = g1 < first + ng ? g1 : first + ng;
            if (a < b) {
                const int c0 = (a - first) * SK_GEMV_STEAL, c1 = (b - first) * SK_GEMV_STEAL;
                gemv_columns(&parts[j], M, xb + at[gemv_pack_kind(parts[j].fmt)], y + col, ldy, acc, two, c0,
                             c1 < parts[j].n ? c1 : parts[j].n);
            }
            first += ng;
        }
    }
    team_barrier(t);
}

/* mm_gemv_team over a fused matrix's parts, each thread packing all of x for itself: no barrier
 * stands between what made x (a norm or the SwiGLU the thread computed itself, or a shared input
 * complete at the last barrier) and the multiply (gemv_parts_team). */
static void mm_gemv_own_team(const sk_w *parts, int n_parts, int M, const float *x, int ldx, float *y, int ldy,
                             int acc, int two, sk_team *t) {
    size_t at[GEMV_PACKS];
    int groups;
    uint8_t *xb = thread_buffer(SCRATCH_PACK, gemv_parts_layouts(parts, n_parts, M, at, &groups));
    share_begin(t, groups);
    sk_team solo = {0, 1, 0, 0};
    for (int k = 0; k < GEMV_PACKS; k++)
        if (at[k] != SIZE_MAX) gemv_pack_team(k, M, parts[0].k, x, ldx, xb + at[k], &solo);
    gemv_parts_team(parts, n_parts, M, xb, at, y, ldy, acc, two, t);
}

/* y [M][ldy] (+)= x . W^T, x packed in w's layout at xb by the team before the last barrier (the
 * attention's output, as each thread finished its heads: attend_rows) */
static void mm_gemv_packed_team(const sk_w *w, int M, const uint8_t *xb, float *y, int ldy, int acc, int two,
                                sk_team *t) {
    size_t at[GEMV_PACKS];
    int groups;
    gemv_parts_layouts(w, 1, M, at, &groups);
    share_begin(t, groups);
    gemv_parts_team(w, 1, M, xb, at, y, ldy, acc, two, t);
}

#endif
