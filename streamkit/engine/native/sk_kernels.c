/* streamkit native CPU decode path.
 *
 * Matmuls read the GGUF's quantized blocks as the file stores them (Q4_1, Q4_0, Q8_0; F32 for
 * anything else) and dequantize them in registers:
 *   - fp32 path (AVX-512 FMA): w = d*q + m in fp32, exactly gguf's dequantize, then fp32 dot
 *     products. Used for steps with few rows, where reading the weights is the cost.
 *   - AMX path (bf16 tiles, fp32 accumulate): a 32-column strip of weights is dequantized to bf16
 *     once per step and multiplied with every row of the step. Used for batched steps, where the
 *     fp32 FMAs would be the cost.
 * sk_forward runs a whole Llama step (every layer, attention over the paged KV cache, final norm and
 * LM head) in one call, so a decode step costs one Python call instead of ~750 torch ops.
 *
 * Built at run time with -march=native by streamkit/engine/native/__init__.py; needs AVX-512F and
 * F16C. AMX is used when the compiler targets it and the kernel grants the tile state (arch_prctl).
 */
#define _GNU_SOURCE
#include <cpuid.h>
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#if !defined(__AVX512F__) || !defined(__F16C__)
#error "the streamkit native kernels need AVX-512F and F16C"
#endif
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#define SK_AMX 1
#else
#define SK_AMX 0
#endif

#include "sk_pool.h"

#define SK_API __attribute__((visibility("default")))
#define INLINE static inline __attribute__((always_inline))

enum { SK_F32 = 0, SK_Q4_1 = 1, SK_Q8_0 = 2, SK_Q4_0 = 3, SK_Q4_K = 4, SK_Q6_K = 5 };
/* SK_Q4_K: a GGUF Q4_K super-block of 256 values as 8 blocks of 32. qs as Q4_1 (16 bytes a block:
 * value i in the low nibble of byte i, value i + 16 in the high nibble); sc per super-block 24
 * bytes: float d, float dmin, uint8 scale[8], uint8 min[8] (the 6-bit pairs unpacked). A block's
 * values are (d * scale) * q - dmin * min, computed in fp32 as gguf's dequantize computes them.
 * SK_Q6_K: a GGUF Q6_K super-block as 8 blocks of 32 with 6-bit values 0..63 in natural order; qs 24
 * bytes a block: the low 4 bits as Q4_1's nibbles, then two uint32 holding the high 2 bits of
 * values 0..15 and 16..31 (value i at bits 2i); sc per super-block 24 bytes: float d, 4 unused bytes,
 * int8 scale[16] (one per 16 values). Values are (d * scale) * (q - 32), as in gguf. */

/* A weight of n output rows by k inputs, repacked at load from the GGUF blocks into two arrays so
 * the scales can be broadcast straight from memory (converting fp16 scales in the loop made it
 * compute-bound; separate fp32 scales measured 25 % faster for batch-1 steps):
 *   Q4_1: qs [n][k/32][16] (nibbles as in the file: low = values 0..15, high = 16..31), sc [n][k/32][2] = (d, m)
 *   Q4_0: qs as Q4_1, sc [n][k/32][2] = (d, 0)
 *   Q8_0: qs [n][k/32][32] int8, sc [n][k/32] = d
 *   F32:  qs = float [n][k], sc unused */
typedef struct {
    int fmt, n, k;
    const uint8_t *qs;
    const float *sc;
} sk_w;

static const float J_Q4_1[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
static const float J_Q4_0[16] = {-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7};
/* the order the AMX path dequantizes a 4-bit block's 32 values in (see dq_strip) */
static const uint16_t Q4_ORDER[32] = {0,  2,  4,  6,  8,  10, 12, 14, 1,  3,  5,  7,  9,  11, 13, 15,
                                      16, 18, 20, 22, 24, 26, 28, 30, 17, 19, 21, 23, 25, 27, 29, 31};

/* scale and offset of block b (row-major block index) of a SK_Q4_K weight */
INLINE void q4k_scale(const float *sc, size_t b, float *s0, float *s1) {
    const float *S = sc + 6 * (b >> 3);
    const uint8_t *u = (const uint8_t *)(S + 2);
    *s0 = S[0] * (float)u[b & 7];
    *s1 = -(S[1] * (float)u[8 + (b & 7)]);
}

/* Block kb of row n -> lo = values 0..15, hi = values 16..31, bit-identical to gguf's dequantize
 * (Q4_1 d*q + m, Q4_0 d*(q-8), Q8_0 q*d, in fp32). The 4-bit formats dequantize a 16-entry table
 * (d*j + m) and pick from it with vpermps: fewer instructions than converting every value. */
INLINE void dq_block(int fmt, const sk_w *w, int n, int kb, __m512 *lo, __m512 *hi) {
    const int nb = w->k / 32;
    const size_t b = (size_t)n * nb + kb;
    if (fmt == SK_Q4_1 || fmt == SK_Q4_0 || fmt == SK_Q4_K) {
        float s0, s1;
        if (fmt == SK_Q4_K) {
            q4k_scale(w->sc, b, &s0, &s1);
        } else {
            s0 = w->sc[2 * b];
            s1 = w->sc[2 * b + 1];
        }
        const __m512 tbl = _mm512_add_ps(_mm512_mul_ps(_mm512_set1_ps(s0),
                                                       _mm512_loadu_ps(fmt == SK_Q4_0 ? J_Q4_0 : J_Q4_1)),
                                         _mm512_set1_ps(s1));
        const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(w->qs + 16 * b)));
        *lo = _mm512_permutexvar_ps(q, tbl); /* vpermps reads only the low 4 bits of each index */
        *hi = _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), tbl);
    } else if (fmt == SK_Q6_K) {
        const float *S = w->sc + 6 * (b >> 3);
        const int8_t *scale = (const int8_t *)(S + 2) + 2 * (b & 7);
        const uint8_t *qb = w->qs + 24 * b;
        uint32_t h[2];
        memcpy(h, qb + 16, 8);
        const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)qb));
        const __m512i sh = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
        const __m512i m4 = _mm512_set1_epi32(15), m2 = _mm512_set1_epi32(3), off = _mm512_set1_epi32(32);
        const __m512i ql = _mm512_and_si512(q, m4), qh = _mm512_srli_epi32(q, 4);
        const __m512i vl = _mm512_or_si512(ql, _mm512_slli_epi32(
                                                   _mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32((int)h[0]), sh), m2), 4));
        const __m512i vh = _mm512_or_si512(qh, _mm512_slli_epi32(
                                                   _mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32((int)h[1]), sh), m2), 4));
        *lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(vl, off)), _mm512_set1_ps(S[0] * (float)scale[0]));
        *hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(vh, off)), _mm512_set1_ps(S[0] * (float)scale[1]));
    } else if (fmt == SK_Q8_0) {
        const __m512 d = _mm512_set1_ps(w->sc[b]);
        const __m128i *q = (const __m128i *)(w->qs + 32 * b);
        *lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q))), d);
        *hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q + 1))), d);
    } else {
        const float *f = (const float *)w->qs + (size_t)n * w->k + (size_t)kb * 32;
        *lo = _mm512_loadu_ps(f);
        *hi = _mm512_loadu_ps(f + 16);
    }
}

static void dq_row(const sk_w *w, int n, float *out) {
    __m512 lo, hi;
    for (int kb = 0; kb < w->k / 32; kb++) {
        dq_block(w->fmt, w, n, kb, &lo, &hi);
        _mm512_storeu_ps(out + kb * 32, lo);
        _mm512_storeu_ps(out + kb * 32 + 16, hi);
    }
}

/* The hardware prefetcher alone kept a core at about half the memory bandwidth on the weight
 * streams (the 210 layer matmuls of a batch-1 step: 7.0 ms without these prefetches, 5.1 ms with,
 * same process and data; AMX strips 16 rows ahead: 16-row matmuls 12.3 -> 10.1 ms). */
#define SK_PREFETCH_AHEAD 2048 /* bytes of qs ahead of the rows being multiplied */
#define SK_STRIP_AHEAD 16      /* rows ahead of the one being dequantized into an AMX strip */

static int qs_block_bytes(int fmt) { return fmt == SK_Q8_0 ? 32 : fmt == SK_F32 ? 128 : fmt == SK_Q6_K ? 24 : 16; }
static int sc_block_bytes(int fmt) {
    return fmt == SK_Q8_0 ? 4 : fmt == SK_F32 ? 0 : (fmt == SK_Q4_K || fmt == SK_Q6_K) ? 3 : 8;
}

/* prefetcht0 as a volatile asm: GCC 12 deletes a loop of _mm_prefetch calls once it is inlined */
INLINE void prefetch(const void *p) { __asm__ volatile("prefetcht0 %0" : : "m"(*(const char *)p)); }

/* pull rows [n, n + count) of a weight (both of its arrays) towards the L1 */
static inline void prefetch_rows(const sk_w *w, int n, int count) {
    if (n + count > w->n) count = w->n - n;
    if (count <= 0) return;
    const size_t nb = w->k / 32, qb = qs_block_bytes(w->fmt), sb = sc_block_bytes(w->fmt);
    const char *q = (const char *)w->qs + (size_t)n * nb * qb;
    for (size_t i = 0; i < count * nb * qb; i += 64) prefetch(q + i);
    const char *s = (const char *)w->sc + (size_t)n * nb * sb;
    for (size_t i = 0; i < count * nb * sb; i += 64) prefetch(s + i);
}

/* ------------------------------------------------------------------ fp32 path */

/* y[r][n] (+)= x[r] . W[n] for MR rows (<= 4) and NC columns (4 or 1) starting at n. */
INLINE void fma_tile(int fmt, int NC, int MR, const sk_w *w, int n, const float *x, int ldx, float *y, int ldy,
                     int acc) {
    __m512 a[4][4];
    for (int c = 0; c < NC; c++)
        for (int r = 0; r < MR; r++) a[c][r] = _mm512_setzero_ps();
    const int nb = w->k / 32;
    for (int kb = 0; kb < nb; kb++) {
        __m512 xl[4], xh[4];
        for (int r = 0; r < MR; r++) {
            xl[r] = _mm512_loadu_ps(x + (size_t)r * ldx + kb * 32);
            xh[r] = _mm512_loadu_ps(x + (size_t)r * ldx + kb * 32 + 16);
        }
        for (int c = 0; c < NC; c++) {
            __m512 lo, hi;
            dq_block(fmt, w, n + c, kb, &lo, &hi);
            for (int r = 0; r < MR; r++) a[c][r] = _mm512_fmadd_ps(xh[r], hi, _mm512_fmadd_ps(xl[r], lo, a[c][r]));
        }
    }
    for (int c = 0; c < NC; c++)
        for (int r = 0; r < MR; r++) {
            const float s = _mm512_reduce_add_ps(a[c][r]);
            float *o = y + (size_t)r * ldy + n + c;
            *o = acc ? *o + s : s;
        }
}

#define FMA_CASE(F, MR)                                                                   \
    do {                                                                                  \
        for (; c + 4 <= c1; c += 4) {                                                     \
            if (c + ahead < c1) prefetch_rows(w, c + ahead, 4);                           \
            fma_tile(F, 4, MR, w, c, x, ldx, y, ldy, acc);                                \
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

/* ------------------------------------------------------------------ AMX path */
#if SK_AMX
typedef struct {
    uint8_t palette_id, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed)) tile_config;

static void amx_configure(void) {
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette_id = 1;
    for (int i = 0; i < 8; i++) {
        cfg.rows[i] = 16;
        cfg.colsb[i] = 64;
    }
    _tile_loadconfig(&cfg);
}

/* r[i][j] -> r[j][i] for a 16 x 16 block of floats held in 16 registers */
INLINE void transpose16(__m512 r[16]) {
    __m512 t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = (__m512)_mm512_unpacklo_pd((__m512d)t[i], (__m512d)t[i + 2]);
        r[i + 1] = (__m512)_mm512_unpackhi_pd((__m512d)t[i], (__m512d)t[i + 2]);
        r[i + 2] = (__m512)_mm512_unpacklo_pd((__m512d)t[i + 1], (__m512d)t[i + 3]);
        r[i + 3] = (__m512)_mm512_unpackhi_pd((__m512d)t[i + 1], (__m512d)t[i + 3]);
    }
    /* r[4g + c], 128-bit lane L: column c + 4L of rows 4g..4g+3; a 4 x 4 transpose of lanes is left */
    for (int i = 0; i < 4; i++) {
        t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);
        t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
        r[i + 4] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0x88);
        r[i + 12] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0xdd);
    }
}

/* x [M][K] fp32 -> bf16 "B" tiles [MT][K/32][16 pair rows][16 rows of x][2], zero padded: tile
 * (mt, kb) holds x[mt*16 + m][kb*32 + order[2p + j]] at pair row p, column m, element j, where
 * order is the k order the weight strips are dequantized in (Q4_ORDER for 4-bit weights, else
 * 0..31): any order works as long as both operands share it. */
static void pack_x_team(const float *x, int ldx, int M, int K, int q4, uint32_t *xb, sk_team *t) {
    const int MT = (M + 15) / 16, NB = K / 32;
    const __m512i stride = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                              _mm512_set1_epi32(16));
    const __m512i order = _mm512_loadu_si512(Q4_ORDER);
    int i0, i1;
    team_span(t, MT * NB, &i0, &i1);
    for (int i = i0; i < i1; i++) {
        const int mt = i / NB, kb = i % NB;
        uint32_t *tile = xb + ((size_t)mt * NB + kb) * 256;
        for (int m = 0; m < 16; m++) {
            const int row = mt * 16 + m;
            __m512i v = _mm512_setzero_si512();
            if (row < M) {
                const float *p = x + (size_t)row * ldx + kb * 32;
                v = (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(p + 16), _mm512_loadu_ps(p));
                if (q4) v = _mm512_permutexvar_epi16(order, v);
            }
            _mm512_i32scatter_epi32(tile + m, stride, v, 4);
        }
    }
}

/* 16 weight rows (output columns n0..n0+15) -> bf16 [16][K], the "A" operand of every tile of the
 * strip. 4-bit blocks: the 16-entry table d*j + m is rounded to bf16 once, stored twice (vpermw
 * reads 5 index bits) and picked with vpermw. The indices come from one broadcast load of the
 * block's 16 bytes shifted per 128-bit lane by 0, 8, 4, 12 bits: word i of lane l then holds in
 * its low bits the low (l = 0, 1) or high (l = 2, 3) nibble of byte 2i + (l & 1), so the values
 * come out in Q4_ORDER, not 0..31 (no cross-lane shuffle to put them back; x is packed in the same
 * order). Two port-5 ops a block instead of five. */
INLINE void dq_strip(int fmt, const sk_w *w, int n0, uint16_t *buf) {
    const int K = w->k, NB = K / 32;
    if (fmt == SK_Q4_1 || fmt == SK_Q4_0 || fmt == SK_Q4_K) {
        /* the strip's rows are contiguous in qs, sc and buf: one pass over 16 * NB blocks, with
         * the pointers in registers (through w they were reloaded every block: buf may alias) */
        const __m512i shifts = _mm512_set_epi64(0x000c000c000c000cLL, 0x000c000c000c000cLL, 0x0004000400040004LL,
                                                0x0004000400040004LL, 0x0008000800080008LL, 0x0008000800080008LL, 0, 0);
        const __m512 J = _mm512_loadu_ps(fmt == SK_Q4_0 ? J_Q4_0 : J_Q4_1);
        const uint8_t *q = w->qs + (size_t)n0 * NB * 16;
        const float *s = w->sc + (fmt == SK_Q4_K ? 0 : (size_t)n0 * NB * 2);
        size_t b = (size_t)n0 * NB;
        uint16_t *dst = buf;
        for (int c = 0; c < 16; c++) {
            prefetch_rows(w, n0 + c + SK_STRIP_AHEAD, 1);
#pragma GCC unroll 2
            for (int kb = 0; kb < NB; kb++, q += 16, dst += 32, b++) {
                float s0, s1;
                if (fmt == SK_Q4_K) {
                    q4k_scale(w->sc, b, &s0, &s1);
                } else {
                    s0 = s[0];
                    s1 = s[1];
                    s += 2;
                }
                const __m512 tbl = _mm512_fmadd_ps(_mm512_set1_ps(s0), J, _mm512_set1_ps(s1));
                const __m512i t32 = (__m512i)_mm512_cvtne2ps_pbh(tbl, tbl);
                const __m512i qq = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)q));
                _mm512_storeu_si512(dst, _mm512_permutexvar_epi16(_mm512_srlv_epi16(qq, shifts), t32));
            }
        }
        return;
    }
    for (int c = 0; c < 16; c++) {
        uint16_t *dst = buf + (size_t)c * K;
        prefetch_rows(w, n0 + c + SK_STRIP_AHEAD, 1);
        for (int kb = 0; kb < NB; kb++) {
            __m512 lo, hi;
            dq_block(fmt, w, n0 + c, kb, &lo, &hi);
            _mm512_storeu_si512(dst + kb * 32, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
        }
    }
}

static void dq_strip_any(const sk_w *w, int n0, uint16_t *buf) {
    switch (w->fmt) {
    case SK_Q4_1: dq_strip(SK_Q4_1, w, n0, buf); break;
    case SK_Q8_0: dq_strip(SK_Q8_0, w, n0, buf); break;
    case SK_Q4_0: dq_strip(SK_Q4_0, w, n0, buf); break;
    case SK_Q4_K: dq_strip(SK_Q4_K, w, n0, buf); break;
    case SK_Q6_K: dq_strip(SK_Q6_K, w, n0, buf); break;
    default: dq_strip(SK_F32, w, n0, buf); break;
    }
}

static __thread uint16_t *t_strip;
static __thread size_t t_strip_cap;

static uint16_t *strip_buffer(size_t elems) {
    if (t_strip_cap < elems) {
        free(t_strip);
        t_strip = aligned_alloc(64, (elems * 2 + 63) / 64 * 64);
        if (!t_strip) abort(); /* a few hundred KB per thread: nothing sensible is left to do */
        t_strip_cap = elems;
    }
    return t_strip;
}

/* Strips of 32 output columns (two tiles) are split over the threads; each strip is dequantized
 * once and multiplied with every 16-row tile of x (packed into xb first). Threads must have loaded
 * the tile configuration (amx_configure). */
static void mm_amx_team(const sk_w *w, int M, const float *x, int ldx, uint32_t *xb, float *y, int ldy, int acc,
                        sk_team *t) {
    const int N = w->n, K = w->k, NB = K / 32, MT = (M + 15) / 16;
    pack_x_team(x, ldx, M, K, w->fmt == SK_Q4_1 || w->fmt == SK_Q4_0 || w->fmt == SK_Q4_K, xb, t);
    team_barrier(t);
    uint16_t *buf = strip_buffer((size_t)32 * K);
    float ctile[2][16 * 16] __attribute__((aligned(64)));
    int s0, s1;
    team_span(t, (N + 31) / 32, &s0, &s1);
    for (int s = s0; s < s1; s++) {
        const int n0 = s * 32, two = n0 + 16 < N;
        dq_strip_any(w, n0, buf);
        if (two) dq_strip_any(w, n0 + 16, buf + (size_t)16 * K);
        for (int mt = 0; mt < MT; mt++) {
            const uint32_t *bt = xb + (size_t)mt * NB * 256;
            _tile_zero(0);
            _tile_zero(1);
            for (int kb = 0; kb < NB; kb++) {
                _tile_loadd(6, bt + (size_t)kb * 256, 64);
                _tile_loadd(4, buf + kb * 32, K * 2);
                _tile_dpbf16ps(0, 4, 6);
                if (two) {
                    _tile_loadd(5, buf + (size_t)16 * K + kb * 32, K * 2);
                    _tile_dpbf16ps(1, 5, 6);
                }
            }
            _tile_stored(0, ctile[0], 64);
            if (two) _tile_stored(1, ctile[1], 64);
            const int rows = M - mt * 16 < 16 ? M - mt * 16 : 16;
            for (int h = 0; h <= two; h++) {
                __m512 r[16];
                for (int i = 0; i < 16; i++) r[i] = _mm512_load_ps(ctile[h] + i * 16);
                transpose16(r); /* the tile is [output column][row of x]; y wants rows */
                for (int m = 0; m < rows; m++) {
                    float *o = y + (size_t)(mt * 16 + m) * ldy + n0 + h * 16;
                    _mm512_storeu_ps(o, acc ? _mm512_add_ps(_mm512_loadu_ps(o), r[m]) : r[m]);
                }
            }
        }
    }
}
#endif

static int g_amx = 0; /* AMX compiled in, present and granted by the kernel */

/* the AMX path's packed-activation buffer, for `rows` rows of at most `k` inputs */
static size_t xb_elems(int rows, int k) { return (size_t)((rows + 15) / 16) * (k / 32) * 256; }

static int use_amx(const sk_w *w, int M, int amx_min_rows) {
    return SK_AMX && g_amx && amx_min_rows > 0 && M >= amx_min_rows && w->n % 16 == 0;
}

/* y [M][ldy] (+)= x [M][ldx] . W^T by every thread of the team, then a barrier; xb: xb_elems(M, w->k) */
static void matmul_team(const sk_w *w, int M, const float *x, int ldx, float *y, int ldy, int acc, int amx_min_rows,
                        uint32_t *xb, sk_team *t) {
#if SK_AMX
    if (use_amx(w, M, amx_min_rows))
        mm_amx_team(w, M, x, ldx, xb, y, ldy, acc, t);
    else
#endif
        mm_fma_team(w, M, x, ldx, y, ldy, acc, t);
    (void)xb;
    (void)amx_min_rows;
    team_barrier(t);
}

static void team_begin(int amx) {
#if SK_AMX
    if (amx) amx_configure();
#endif
    (void)amx;
}

static void team_end(int amx) {
#if SK_AMX
    if (amx) _tile_release();
#endif
    (void)amx;
}

/* ------------------------------------------------------------------ elementwise */

/* exp for the softmax and SiLU: Cephes' single-precision polynomial (about 1 ulp) */
INLINE __m512 exp512(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-88.37626f)), _mm512_set1_ps(88.37626f));
    __m512 fx = _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
                                     _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), x);
    __m512 y = _mm512_set1_ps(1.9875691500E-4f);
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507E-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073E-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894E-2f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459E-1f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201E-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(y, fx);
}

static void rms_norm(const float *x, const float *w, int D, float eps, float *out) {
    __m512 ss = _mm512_setzero_ps();
    for (int i = 0; i < D; i += 16) {
        const __m512 v = _mm512_loadu_ps(x + i);
        ss = _mm512_fmadd_ps(v, v, ss);
    }
    const __m512 r = _mm512_set1_ps(1.0f / sqrtf(_mm512_reduce_add_ps(ss) / (float)D + eps));
    for (int i = 0; i < D; i += 16)
        _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), r), _mm512_loadu_ps(w + i)));
}

/* interleaved-pair rotation (GGUF's Q/K row order): (x0, x1) -> (x0 c - x1 s, x0 s + x1 c) */
static void rope(float *v, int n_heads, int hd, const float *cs, const float *sn) {
    for (int h = 0; h < n_heads; h++) {
        float *p = v + (size_t)h * hd;
        for (int i = 0; i < hd / 2; i++) {
            const float x0 = p[2 * i], x1 = p[2 * i + 1];
            p[2 * i] = x0 * cs[i] - x1 * sn[i];
            p[2 * i + 1] = x0 * sn[i] + x1 * cs[i];
        }
    }
}

/* ------------------------------------------------------------------ model */

typedef struct {
    const float *attn_norm, *ffn_norm;
    sk_w qkv, o, gu, down;
    const float *qkv_bias; /* NULL, or [(n_heads + 2 n_kv) head_dim] added after the QKV matmul (qwen2) */
} sk_layer;

typedef struct {
    int n_layers, dim, ffn, n_heads, n_kv, head_dim, vocab;
    float eps, scale;
    sk_w embed, head;
    const float *out_norm, *rope_cos, *rope_sin; /* rope tables [rope_len][head_dim / 2] */
    int rope_len;
    sk_layer *layers;
    /* [n_layers][n_kv][pool_slots][head_dim], float32 or (kv_half) float16; each block of K is stored
     * transposed, [head_dim][block_size], so the scores of 16 positions come out of head_dim FMAs with
     * no horizontal sums */
    void *k_pool, *v_pool;
    long pool_slots;
    int block_size, kv_half;
    /* scratch, grown on demand */
    float *x, *h, *qkv, *att, *gu, *act, *lx;
    uint32_t *xb;
    int cap_t, cap_r;
} sk_model;

SK_API int sk_init(void) {
    int caps = 1;
#if SK_AMX
    unsigned a, b, c, d;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d) && (d & (1u << 22)) && (d & (1u << 24))) {
        /* ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA: Linux hands out the tile state on request */
        if (syscall(SYS_arch_prctl, 0x1023, 18) == 0) g_amx = 1;
    }
#endif
    if (g_amx) caps |= 2;
    return caps;
}

SK_API sk_model *sk_model_new(int n_layers, int dim, int ffn, int n_heads, int n_kv, int head_dim, int vocab,
                              float eps, float scale) {
    if (dim % 32 || ffn % 32 || head_dim % 16 || head_dim > 256 || n_kv <= 0 || n_heads % n_kv ||
        n_heads / n_kv > 32)
        return NULL;
    sk_model *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->n_layers = n_layers; m->dim = dim; m->ffn = ffn; m->n_heads = n_heads; m->n_kv = n_kv;
    m->head_dim = head_dim; m->vocab = vocab; m->eps = eps; m->scale = scale;
    m->layers = calloc((size_t)n_layers, sizeof(sk_layer));
    if (!m->layers) { free(m); return NULL; }
    return m;
}

static void free_scratch(sk_model *m) {
    free(m->x); free(m->h); free(m->qkv); free(m->att); free(m->gu); free(m->act); free(m->lx); free(m->xb);
    m->x = m->h = m->qkv = m->att = m->gu = m->act = m->lx = NULL;
    m->xb = NULL;
}

SK_API void sk_model_free(sk_model *m) {
    if (!m) return;
    free_scratch(m);
    free(m->layers);
    free(m);
}

/* every weight is passed as (format, qs, sc): see sk_w */
SK_API void sk_model_set_globals(sk_model *m, int embed_fmt, const uint8_t *embed_qs, const float *embed_sc, int head_fmt,
                                 const uint8_t *head_qs, const float *head_sc, const float *out_norm,
                                 const float *rope_cos, const float *rope_sin, int rope_len) {
    m->embed = (sk_w){embed_fmt, m->vocab, m->dim, embed_qs, embed_sc};
    m->head = (sk_w){head_fmt, m->vocab, m->dim, head_qs, head_sc};
    m->out_norm = out_norm; m->rope_cos = rope_cos; m->rope_sin = rope_sin; m->rope_len = rope_len;
}

/* qkv: the q, k and v rows stacked (one matmul); gu: gate rows then up rows */
SK_API void sk_model_set_layer(sk_model *m, int i, const float *attn_norm, const float *ffn_norm, int qkv_fmt,
                               const uint8_t *qkv_qs, const float *qkv_sc, int o_fmt, const uint8_t *o_qs,
                               const float *o_sc, int gu_fmt, const uint8_t *gu_qs, const float *gu_sc, int down_fmt,
                               const uint8_t *down_qs, const float *down_sc) {
    const int hd = m->head_dim, qkv_n = (m->n_heads + 2 * m->n_kv) * hd;
    sk_layer *L = &m->layers[i];
    L->attn_norm = attn_norm; L->ffn_norm = ffn_norm;
    L->qkv = (sk_w){qkv_fmt, qkv_n, m->dim, qkv_qs, qkv_sc};
    L->o = (sk_w){o_fmt, m->dim, m->n_heads * hd, o_qs, o_sc};
    L->gu = (sk_w){gu_fmt, 2 * m->ffn, m->dim, gu_qs, gu_sc};
    L->down = (sk_w){down_fmt, m->dim, m->ffn, down_qs, down_sc};
}

SK_API void sk_model_set_qkv_bias(sk_model *m, int i, const float *bias) { m->layers[i].qkv_bias = bias; }

/* kv_bytes: 4 (float32) or 2 (float16) per element */
SK_API int sk_model_set_kv(sk_model *m, void *k_pool, void *v_pool, long pool_slots, int block_size, int kv_bytes) {
    if (block_size % 16 || (kv_bytes != 2 && kv_bytes != 4)) return -1;
    m->k_pool = k_pool; m->v_pool = v_pool; m->pool_slots = pool_slots; m->block_size = block_size;
    m->kv_half = kv_bytes == 2;
    return 0;
}

static int ensure_scratch(sk_model *m, int T, int R) {
    if (T <= m->cap_t && R <= m->cap_r && m->x) return 0;
    free_scratch(m);
    const int t = T > m->cap_t ? T : m->cap_t, r = R > m->cap_r ? R : m->cap_r;
    const size_t D = m->dim, QKV = (size_t)(m->n_heads + 2 * m->n_kv) * m->head_dim, A = (size_t)m->n_heads * m->head_dim;
    m->x = aligned_alloc(64, t * D * 4);
    m->h = aligned_alloc(64, t * (D > A ? D : A) * 4);
    m->qkv = aligned_alloc(64, t * QKV * 4);
    m->att = aligned_alloc(64, t * A * 4);
    m->gu = aligned_alloc(64, t * 2 * (size_t)m->ffn * 4);
    m->act = aligned_alloc(64, t * (size_t)m->ffn * 4);
    m->lx = aligned_alloc(64, (size_t)r * D * 4);
    const int kmax = m->ffn > (int)A ? (m->ffn > (int)D ? m->ffn : (int)D) : ((int)A > (int)D ? (int)A : (int)D);
    m->xb = aligned_alloc(64, xb_elems(t > r ? t : r, kmax) * 4);
    m->cap_t = t; m->cap_r = r;
    return (m->x && m->h && m->qkv && m->att && m->gu && m->act && m->lx && m->xb) ? 0 : -1;
}

static __thread float *t_scores;
static __thread size_t t_scores_cap;

/* 16 K or V values at p (float32, or float16 when half) as float32 */
INLINE __m512 kv_load(const void *p, size_t i, int half) {
    return half ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i)))
                : _mm512_loadu_ps((const float *)p + i);
}

/* One token's query group (the G heads sharing KV head kvh) over positions 0..ctx-1 of its
 * sequence: scores, softmax with the row maximum subtracted, weighted sum of V. */
INLINE void attend_kv(const sk_model *m, int layer, int kvh, const float *q, int ctx, const int32_t *table, float *out,
                      int half) {
    const int hd = m->head_dim, G = m->n_heads / m->n_kv, bs = m->block_size, HV = hd / 16;
    const int nblk = (ctx + bs - 1) / bs, stride = nblk * bs;
    const size_t need = (size_t)G * stride;
    if (t_scores_cap < need) {
        free(t_scores);
        t_scores = aligned_alloc(64, need * 4);
        if (!t_scores) abort(); /* G x context floats per thread, as strip_buffer */
        t_scores_cap = need;
    }
    float *sc = t_scores;
    const size_t base = ((size_t)layer * m->n_kv + kvh) * (size_t)m->pool_slots * hd; /* in elements */
    const __m512 scale = _mm512_set1_ps(m->scale);
    for (int b = 0; b < nblk; b++) {
        const size_t kt = base + (size_t)table[b] * bs * hd; /* [hd][bs] */
        if (b + 1 < nblk) { /* the next block of this sequence is anywhere in the pool */
            const size_t next = (base + (size_t)table[b + 1] * bs * hd) << (2 - half), bytes = (size_t)(bs * hd) << (2 - half);
            for (size_t i = 0; i < bytes; i += 64) {
                prefetch((const char *)m->k_pool + next + i);
                prefetch((const char *)m->v_pool + next + i);
            }
        }
        for (int c = 0; c < bs; c += 16)
            for (int g0 = 0; g0 < G; g0 += 4) {
                const int gn = G - g0 < 4 ? G - g0 : 4;
                __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
                const float *qg = q + (size_t)g0 * hd;
                for (int d = 0; d < hd; d++) {
                    const __m512 kv = kv_load(m->k_pool, kt + (size_t)d * bs + c, half);
                    for (int g = 0; g < gn; g++) a[g] = _mm512_fmadd_ps(_mm512_set1_ps(qg[(size_t)g * hd + d]), kv, a[g]);
                }
                for (int g = 0; g < gn; g++)
                    _mm512_storeu_ps(sc + (size_t)(g0 + g) * stride + b * bs + c, _mm512_mul_ps(a[g], scale));
            }
    }
    float inv_sum[32];
    for (int g = 0; g < G; g++) {
        float *s = sc + (size_t)g * stride;
        for (int p = ctx; p < stride; p++) s[p] = -INFINITY;
        __m512 mx = _mm512_set1_ps(-INFINITY);
        for (int p = 0; p < stride; p += 16) mx = _mm512_max_ps(mx, _mm512_loadu_ps(s + p));
        const __m512 vm = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
        __m512 sum = _mm512_setzero_ps();
        for (int p = 0; p < stride; p += 16) {
            const __mmask16 live = p + 16 <= ctx ? 0xFFFF : (__mmask16)((1u << (ctx - p)) - 1);
            const __m512 e = _mm512_maskz_mov_ps(live, exp512(_mm512_sub_ps(_mm512_loadu_ps(s + p), vm)));
            _mm512_storeu_ps(s + p, e);
            sum = _mm512_add_ps(sum, e);
        }
        inv_sum[g] = 1.0f / _mm512_reduce_add_ps(sum);
    }
    /* weighted sum of V, up to 4 heads per pass so each V row is loaded once per pass */
    for (int g0 = 0; g0 < G; g0 += 4) {
        const int gn = G - g0 < 4 ? G - g0 : 4;
        __m512 o[4][16];
        for (int g = 0; g < gn; g++)
            for (int j = 0; j < HV; j++) o[g][j] = _mm512_setzero_ps();
        for (int b = 0; b < nblk; b++) {
            const size_t vb = base + (size_t)table[b] * bs * hd;
            const int n = ctx - b * bs < bs ? ctx - b * bs : bs;
            for (int i = 0; i < n; i++)
                for (int j = 0; j < HV; j++) {
                    const __m512 v = kv_load(m->v_pool, vb + (size_t)i * hd + 16 * j, half);
                    for (int g = 0; g < gn; g++)
                        o[g][j] = _mm512_fmadd_ps(_mm512_set1_ps(sc[(size_t)(g0 + g) * stride + b * bs + i]), v, o[g][j]);
                }
        }
        for (int g = 0; g < gn; g++) {
            const __m512 inv = _mm512_set1_ps(inv_sum[g0 + g]);
            for (int j = 0; j < HV; j++) _mm512_storeu_ps(out + (size_t)(g0 + g) * hd + 16 * j, _mm512_mul_ps(o[g][j], inv));
        }
    }
}

static void attend(const sk_model *m, int layer, int kvh, const float *q, int ctx, const int32_t *table, float *out) {
    if (m->kv_half) attend_kv(m, layer, kvh, q, ctx, table, out, 1);
    else attend_kv(m, layer, kvh, q, ctx, table, out, 0);
}

/* token r's K (rotated) and V for every KV head into its slot */
static void write_kv(const sk_model *m, int layer, long slot, const float *k, const float *v) {
    const int hd = m->head_dim, bs = m->block_size;
    const long blk = slot / bs, off = slot % bs;
    for (int j = 0; j < m->n_kv; j++) {
        const size_t head = ((size_t)layer * m->n_kv + j) * (size_t)m->pool_slots;
        const size_t kt = (head + (size_t)blk * bs) * hd + off, vr = (head + (size_t)slot) * hd; /* elements */
        const float *kj = k + (size_t)j * hd, *vj = v + (size_t)j * hd;
        if (m->kv_half) {
            uint16_t *kp = (uint16_t *)m->k_pool + kt, *vp = (uint16_t *)m->v_pool + vr;
            for (int d = 0; d < hd; d++) kp[(size_t)d * bs] = _cvtss_sh(kj[d], _MM_FROUND_TO_NEAREST_INT);
            for (int d = 0; d < hd; d += 16)
                _mm256_storeu_si256((__m256i *)(vp + d), _mm512_cvtps_ph(_mm512_loadu_ps(vj + d), _MM_FROUND_TO_NEAREST_INT));
        } else {
            float *kp = (float *)m->k_pool + kt;
            for (int d = 0; d < hd; d++) kp[(size_t)d * bs] = kj[d];
            memcpy((float *)m->v_pool + vr, vj, (size_t)hd * 4);
        }
    }
}

INLINE void silu_mul(const float *g, const float *u, int n, float *out) {
    for (int i = 0; i < n; i += 16) {
        const __m512 gv = _mm512_loadu_ps(g + i);
        const __m512 e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), gv));
        _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_div_ps(gv, _mm512_add_ps(_mm512_set1_ps(1.0f), e)),
                                                _mm512_loadu_ps(u + i)));
    }
}

typedef struct {
    sk_model *m;
    int T, R, nb_stride, amx_min_rows, amx;
    const int32_t *ids, *pos, *tok_seq, *tables, *logit_rows;
    const int64_t *slots;
    float *logits;
} forward_args;

/* rms_norm of rows [0, T) of x into out, this thread's share */
static void norm_rows(const sk_model *m, const float *x, const float *w, int T, float *out, sk_team *t) {
    int a, b;
    team_span(t, T, &a, &b);
    for (int r = a; r < b; r++) rms_norm(x + (size_t)r * m->dim, w, m->dim, m->eps, out + (size_t)r * m->dim);
}

static void forward_job(void *p, sk_team *t) {
    const forward_args *f = p;
    sk_model *m = f->m;
    const int T = f->T, D = m->dim, H = m->n_heads, KV = m->n_kv, hd = m->head_dim, F = m->ffn, G = H / KV;
    const int QKV = (H + 2 * KV) * hd, A = H * hd, amr = f->amx_min_rows;
    int a, b;
    team_begin(f->amx);
    team_span(t, T, &a, &b);
    for (int r = a; r < b; r++) dq_row(&m->embed, f->ids[r], m->x + (size_t)r * D);
    team_barrier(t);
    for (int l = 0; l < m->n_layers; l++) {
        const sk_layer *L = &m->layers[l];
        norm_rows(m, m->x, L->attn_norm, T, m->h, t);
        team_barrier(t);
        matmul_team(&L->qkv, T, m->h, D, m->qkv, QKV, 0, amr, m->xb, t);
        team_span(t, T, &a, &b);
        for (int r = a; r < b; r++) {
            float *q = m->qkv + (size_t)r * QKV, *k = q + A, *v = k + KV * hd;
            if (L->qkv_bias)
                for (int j = 0; j < QKV; j++) q[j] += L->qkv_bias[j];
            const float *cs = m->rope_cos + (size_t)f->pos[r] * (hd / 2), *sn = m->rope_sin + (size_t)f->pos[r] * (hd / 2);
            rope(q, H, hd, cs, sn);
            rope(k, KV, hd, cs, sn);
            write_kv(m, l, (long)f->slots[r], k, v);
        }
        team_barrier(t);
        for (int i = t->tid; i < T * KV; i += t->nt) { /* interleaved: prefill rows grow in length */
            const int r = i / KV, j = i % KV;
            attend(m, l, j, m->qkv + (size_t)r * QKV + (size_t)j * G * hd, f->pos[r] + 1,
                   f->tables + (size_t)f->tok_seq[r] * f->nb_stride, m->att + (size_t)r * A + (size_t)j * G * hd);
        }
        team_barrier(t);
        matmul_team(&L->o, T, m->att, A, m->x, D, 1, amr, m->xb, t);
        norm_rows(m, m->x, L->ffn_norm, T, m->h, t);
        team_barrier(t);
        matmul_team(&L->gu, T, m->h, D, m->gu, 2 * F, 0, amr, m->xb, t);
        team_span(t, T, &a, &b);
        for (int r = a; r < b; r++)
            silu_mul(m->gu + (size_t)r * 2 * F, m->gu + (size_t)r * 2 * F + F, F, m->act + (size_t)r * F);
        team_barrier(t);
        matmul_team(&L->down, T, m->act, F, m->x, D, 1, amr, m->xb, t);
    }
    team_span(t, f->R, &a, &b);
    for (int r = a; r < b; r++)
        rms_norm(m->x + (size_t)f->logit_rows[r] * D, m->out_norm, D, m->eps, m->lx + (size_t)r * D);
    team_barrier(t);
    matmul_team(&m->head, f->R, m->lx, D, f->logits, m->vocab, 0, amr, m->xb, t);
    team_end(f->amx);
}

/* One step over T tokens of any mix of sequences. Token t sits at position pos[t] of the sequence
 * whose block table is tables[tok_seq[t]] (nb_stride entries per row); its K/V go to slot slots[t],
 * and it attends to positions 0..pos[t] (its own included). Logits [R][vocab] for rows logit_rows,
 * on nt threads (0: all CPUs).
 * Returns 0; -1 when scratch memory could not be allocated, -2 for a token id or position out of range. */
SK_API int sk_forward(sk_model *m, int T, const int32_t *ids, const int32_t *pos, const int64_t *slots,
                      const int32_t *tok_seq, const int32_t *tables, int nb_stride, int R, const int32_t *logit_rows,
                      float *logits, int amx_min_rows, int nt) {
    for (int t = 0; t < T; t++)
        if (ids[t] < 0 || ids[t] >= m->vocab || pos[t] < 0 || pos[t] >= m->rope_len) return -2;
    for (int r = 0; r < R; r++)
        if (logit_rows[r] < 0 || logit_rows[r] >= T) return -2;
    if (ensure_scratch(m, T, R)) return -1;
    if (nt <= 0) nt = (int)sysconf(_SC_NPROCESSORS_ONLN);
    forward_args f = {m, T, R, nb_stride, amx_min_rows,
                      SK_AMX && g_amx && amx_min_rows > 0 && (T >= amx_min_rows || R >= amx_min_rows),
                      ids, pos, tok_seq, tables, logit_rows, slots, logits};
    pool_run(forward_job, &f, nt);
    return 0;
}

/* ------------------------------------------------------------------ test entry points */

typedef struct {
    sk_w w;
    int M, acc, amx_min_rows, amx;
    const float *x;
    float *y;
    uint32_t *xb;
} matmul_args;

static void matmul_job(void *p, sk_team *t) {
    const matmul_args *a = p;
    team_begin(a->amx);
    matmul_team(&a->w, a->M, a->x, a->w.k, a->y, a->w.n, a->acc, a->amx_min_rows, a->xb, t);
    team_end(a->amx);
}

/* y [M][N] (+)= x [M][K] . W^T through the same dispatch as the forward */
SK_API int sk_matmul(int fmt, const uint8_t *qs, const float *sc, int N, int K, int M, const float *x, float *y, int acc,
                     int amx_min_rows, int nt) {
    matmul_args a = {{fmt, N, K, qs, sc}, M, acc, amx_min_rows, 0, x, y, NULL};
    a.amx = use_amx(&a.w, M, amx_min_rows);
    if (a.amx && !(a.xb = aligned_alloc(64, xb_elems(M, K) * 4))) return -1;
    if (nt <= 0) nt = (int)sysconf(_SC_NPROCESSORS_ONLN);
    pool_run(matmul_job, &a, nt);
    free(a.xb);
    return 0;
}

/* rows [N][K] of a weight dequantized to fp32 exactly as the matmuls see them */
SK_API void sk_dequant(int fmt, const uint8_t *qs, const float *sc, int N, int K, float *out) {
    const sk_w wt = {fmt, N, K, qs, sc};
    for (int n = 0; n < N; n++) dq_row(&wt, n, out + (size_t)n * K);
}
