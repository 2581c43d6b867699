/* Weight formats and their dequantization to fp32, for every instruction set the kernels build for.
 * Included by sk_kernels.c only (after sk_vec.h). */
#ifndef SK_DEQUANT_H
#define SK_DEQUANT_H

#include <string.h>

enum { SK_F32 = 0, SK_Q4_1 = 1, SK_Q8_0 = 2, SK_Q4_0 = 3, SK_Q4_K = 4, SK_Q6_K = 5, SK_Q5_K = 6, SK_F16 = 7, SK_BFLOAT16 = 8 };
/* SK_Q4_K: a GGUF Q4_K super-block of 256 values as 8 blocks of 32. qs as Q4_1 (16 bytes a block:
 * value i in the low nibble of byte i, value i + 16 in the high nibble); sc per super-block 24
 * bytes: float d, float dmin, uint8 scale[8], uint8 min[8] (the 6-bit pairs unpacked). A block's
 * values are (d * scale) * q - dmin * min, computed in fp32 as gguf's dequantize computes them.
 * SK_Q6_K: a GGUF Q6_K super-block as 8 blocks of 32 with 6-bit values 0..63 in natural order; qs 48
 * bytes a pair of blocks (A, B): A's low 4 bits as Q4_1's nibbles (16 bytes), B's, then 16 bytes h of
 * high bit pairs, h[j] = A[j] | B[j] << 2 | A[16 + j] << 4 | B[16 + j] << 6, so one vector shift a
 * lane puts a register of them at bits 4-5 (sk_gemv.h); sc per super-block 24 bytes: float d, 4
 * unused bytes, int8 scale[16] (one per 16 values). Values are (d * scale) * (q - 32), as in gguf.
 * SK_Q5_K: a GGUF Q5_K super-block as 8 blocks of 32; qs 20 bytes a block: the low 4 bits as Q4_1's
 * nibbles, then a uint32 holding the fifth bit of value i at bit i; sc as SK_Q4_K. Values are
 * (d * scale) * q - dmin * min with q in 0..31, as in gguf.
 * SK_F16, SK_BFLOAT16: the file's 16-bit floats as stored, qs = uint16 [n][k], sc unused. */

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
static const float J_Q5_HI[16] = {16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31};

/* the first of a block's 32 values in a 16-bit float weight */
INLINE const uint16_t *f16_block(const sk_w *w, int n, int kb) {
    return (const uint16_t *)w->qs + (size_t)n * w->k + (size_t)kb * 32;
}

/* scale and offset of block b (row-major block index) of a SK_Q4_K weight */
INLINE void q4k_scale(const float *sc, size_t b, float *s0, float *s1) {
    const float *S = sc + 6 * (b >> 3);
    const uint8_t *u = (const uint8_t *)(S + 2);
    *s0 = S[0] * (float)u[b & 7];
    *s1 = -(S[1] * (float)u[8 + (b & 7)]);
}

/* Where an integer kernel reads column c's scales of block kb: s0[c * cs + kb * bs], and s1 likewise
 * where the format has an offset (s1 NULL: none). s0 multiplies the integers as those kernels
 * unpack them: Q4_0 as q - 8 and Q8_0 signed, so neither has an offset. */
typedef struct {
    const float *s0, *s1;
    size_t cs, bs;
} blk_scales;

/* the scales of the columns from n0 where the weight keeps them (Q4_1, Q4_0, Q8_0); s0 NULL for the
 * formats whose scales a kernel computes (Q4_K) */
INLINE blk_scales weight_scales(const sk_w *w, int n0) {
    const size_t NB = w->k / 32;
    switch (w->fmt) {
    case SK_Q4_1: return (blk_scales){w->sc + n0 * NB * 2, w->sc + n0 * NB * 2 + 1, 2 * NB, 2};
    case SK_Q4_0: return (blk_scales){w->sc + n0 * NB * 2, NULL, 2 * NB, 2};
    case SK_Q8_0: return (blk_scales){w->sc + n0 * NB, NULL, NB, 1};
    default: return (blk_scales){NULL, NULL, 0, 0};
    }
}

/* the (scale, offset) of a 4-bit block: value = s0 * q + s1 (q - 8 for Q4_0, see J_Q4_0) */
INLINE void q4_scales(int fmt, const sk_w *w, size_t b, float *s0, float *s1) {
    if (fmt == SK_Q4_K) {
        q4k_scale(w->sc, b, s0, s1);
    } else {
        *s0 = w->sc[2 * b];
        *s1 = w->sc[2 * b + 1];
    }
}

#ifdef __AVX512F__
/* q4k_scale of the 8 blocks of the super-block that starts at block b: s0 in out[0..7], s1 in
 * out[8..15], in one vector */
INLINE __m512 q4k_scales8_v(const float *sc, size_t b) {
    const float *S = sc + 6 * (b >> 3);
    const __m512 u = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(S + 2))));
    return _mm512_mul_ps(_mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(S[0]), _mm512_set1_ps(-S[1])), u);
}

INLINE void q4k_scales8(const float *sc, size_t b, float *out) { _mm512_storeu_ps(out, q4k_scales8_v(sc, b)); }

/* Block kb of row n -> lo = values 0..15, hi = values 16..31, bit-identical to gguf's dequantize
 * (Q4_1 d*q + m, Q4_0 d*(q-8), Q8_0 q*d, in fp32). The 4-bit formats dequantize a 16-entry table
 * (d*j + m) and pick from it with vpermps: fewer instructions than converting every value. */
INLINE void dq_block(int fmt, const sk_w *w, int n, int kb, v16 *lo, v16 *hi) {
    const int nb = w->k / 32;
    const size_t b = (size_t)n * nb + kb;
    if (fmt == SK_Q4_1 || fmt == SK_Q4_0 || fmt == SK_Q4_K) {
        float s0, s1;
        q4_scales(fmt, w, b, &s0, &s1);
        const __m512 tbl = _mm512_add_ps(_mm512_mul_ps(_mm512_set1_ps(s0),
                                                       _mm512_loadu_ps(fmt == SK_Q4_0 ? J_Q4_0 : J_Q4_1)),
                                         _mm512_set1_ps(s1));
        const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(w->qs + 16 * b)));
        *lo = _mm512_permutexvar_ps(q, tbl); /* vpermps reads only the low 4 bits of each index */
        *hi = _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), tbl);
    } else if (fmt == SK_Q5_K) {
        /* a 32-entry table (d*scale*j - dmin*min, j = 0..31) in two registers, picked by vpermt2ps */
        float s0, s1;
        q4k_scale(w->sc, b, &s0, &s1);
        const __m512 vs0 = _mm512_set1_ps(s0), vs1 = _mm512_set1_ps(s1);
        const __m512 t0 = _mm512_add_ps(_mm512_mul_ps(vs0, _mm512_loadu_ps(J_Q4_1)), vs1);
        const __m512 t1 = _mm512_add_ps(_mm512_mul_ps(vs0, _mm512_loadu_ps(J_Q5_HI)), vs1);
        const uint8_t *qb = w->qs + 20 * b;
        uint32_t h;
        memcpy(&h, qb + 16, 4);
        const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)qb));
        const __m512i sh = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
        const __m512i one = _mm512_set1_epi32(1), m4 = _mm512_set1_epi32(15);
        const __m512i h0 = _mm512_slli_epi32(_mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32((int)h), sh), one), 4);
        const __m512i h1 = _mm512_slli_epi32(
            _mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32((int)(h >> 16)), sh), one), 4);
        *lo = _mm512_permutex2var_ps(t0, _mm512_or_si512(_mm512_and_si512(q, m4), h0), t1);
        *hi = _mm512_permutex2var_ps(t0, _mm512_or_si512(_mm512_srli_epi32(q, 4), h1), t1);
    } else if (fmt == SK_F16) {
        const uint16_t *p = f16_block(w, n, kb);
        *lo = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
        *hi = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 16)));
    } else if (fmt == SK_BFLOAT16) {
        const uint16_t *p = f16_block(w, n, kb);
        *lo = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
        *hi = _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p + 16))), 16));
    } else if (fmt == SK_Q6_K) {
        const float *S = w->sc + 6 * (b >> 3);
        const int8_t *scale = (const int8_t *)(S + 2) + 2 * (b & 7);
        const uint8_t *pair = w->qs + 48 * (b >> 1);
        const int sh = 2 * (int)(b & 1); /* B's pairs sit 2 bits above A's */
        const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(pair + 16 * (b & 1))));
        const __m512i h = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(pair + 32)));
        const __m512i m4 = _mm512_set1_epi32(15), m2 = _mm512_set1_epi32(3), off = _mm512_set1_epi32(32);
        const __m512i ql = _mm512_and_si512(q, m4), qh = _mm512_srli_epi32(q, 4);
        const __m512i vl = _mm512_or_si512(ql, _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(h, sh), m2), 4));
        const __m512i vh = _mm512_or_si512(qh, _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(h, 4 + sh), m2), 4));
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
#else
/* AVX2: the same values (s0 * q then + s1, each rounded as gguf's numpy code rounds them), eight
 * lanes at a time: converting the nibbles is as cheap as a table lookup without vpermps' 16 lanes */
INLINE __m256 q4_8(__m256i q, int q4_0, __m256 s0, __m256 s1) {
    if (q4_0) q = _mm256_sub_epi32(q, _mm256_set1_epi32(8));
    return _mm256_add_ps(_mm256_mul_ps(s0, _mm256_cvtepi32_ps(q)), s1);
}

/* 8 Q6_K values: the low nibbles (shift 0) or high nibbles (4) of 8 bytes, their high bit pairs at
 * bits hshift.. of 8 bytes of h */
INLINE __m256 q6_8(__m128i bytes8, int shift, __m128i h8, int hshift, float d) {
    const __m256i q = _mm256_and_si256(_mm256_srli_epi32(_mm256_cvtepu8_epi32(bytes8), shift), _mm256_set1_epi32(15));
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi32(_mm256_cvtepu8_epi32(h8), hshift), _mm256_set1_epi32(3));
    const __m256i v = _mm256_sub_epi32(_mm256_or_si256(q, _mm256_slli_epi32(hi, 4)), _mm256_set1_epi32(32));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(v), _mm256_set1_ps(d));
}

/* the fifth bits of 8 Q5_K values, bits first.. of h, in place (16) */
INLINE __m256i q5_high8(uint32_t h, int first) {
    const __m256i sh = _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(first));
    return _mm256_slli_epi32(_mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)h), sh), _mm256_set1_epi32(1)), 4);
}

/* 8 bf16 values -> fp32 (exact: the high half of each fp32) */
INLINE __m256 bf16_8(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

INLINE void dq_block(int fmt, const sk_w *w, int n, int kb, v16 *lo, v16 *hi) {
    const int nb = w->k / 32;
    const size_t b = (size_t)n * nb + kb;
    if (fmt == SK_Q4_1 || fmt == SK_Q4_0 || fmt == SK_Q4_K) {
        float s0, s1;
        q4_scales(fmt, w, b, &s0, &s1);
        const __m128i q = _mm_loadu_si128((const __m128i *)(w->qs + 16 * b));
        const __m256i qa = _mm256_cvtepu8_epi32(q), qb = _mm256_cvtepu8_epi32(_mm_srli_si128(q, 8));
        const __m256i m4 = _mm256_set1_epi32(15);
        const __m256 vs0 = _mm256_set1_ps(s0), vs1 = _mm256_set1_ps(s1);
        const int z = fmt == SK_Q4_0;
        lo->a = q4_8(_mm256_and_si256(qa, m4), z, vs0, vs1);
        lo->b = q4_8(_mm256_and_si256(qb, m4), z, vs0, vs1);
        hi->a = q4_8(_mm256_srli_epi32(qa, 4), z, vs0, vs1);
        hi->b = q4_8(_mm256_srli_epi32(qb, 4), z, vs0, vs1);
    } else if (fmt == SK_Q5_K) {
        float s0, s1;
        q4k_scale(w->sc, b, &s0, &s1);
        const uint8_t *qp = w->qs + 20 * b;
        uint32_t h;
        memcpy(&h, qp + 16, 4);
        const __m128i q = _mm_loadu_si128((const __m128i *)qp);
        const __m256i qa = _mm256_cvtepu8_epi32(q), qb = _mm256_cvtepu8_epi32(_mm_srli_si128(q, 8));
        const __m256i m4 = _mm256_set1_epi32(15);
        const __m256 vs0 = _mm256_set1_ps(s0), vs1 = _mm256_set1_ps(s1);
        lo->a = q4_8(_mm256_or_si256(_mm256_and_si256(qa, m4), q5_high8(h, 0)), 0, vs0, vs1);
        lo->b = q4_8(_mm256_or_si256(_mm256_and_si256(qb, m4), q5_high8(h, 8)), 0, vs0, vs1);
        hi->a = q4_8(_mm256_or_si256(_mm256_srli_epi32(qa, 4), q5_high8(h, 16)), 0, vs0, vs1);
        hi->b = q4_8(_mm256_or_si256(_mm256_srli_epi32(qb, 4), q5_high8(h, 24)), 0, vs0, vs1);
    } else if (fmt == SK_F16) {
        const uint16_t *p = f16_block(w, n, kb);
        lo->a = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
        lo->b = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 8)));
        hi->a = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16)));
        hi->b = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 24)));
    } else if (fmt == SK_BFLOAT16) {
        const uint16_t *p = f16_block(w, n, kb);
        lo->a = bf16_8(p);
        lo->b = bf16_8(p + 8);
        hi->a = bf16_8(p + 16);
        hi->b = bf16_8(p + 24);
    } else if (fmt == SK_Q6_K) {
        const float *S = w->sc + 6 * (b >> 3);
        const int8_t *scale = (const int8_t *)(S + 2) + 2 * (b & 7);
        const uint8_t *pair = w->qs + 48 * (b >> 1);
        const int sh = 2 * (int)(b & 1); /* B's pairs sit 2 bits above A's */
        const __m128i q = _mm_loadu_si128((const __m128i *)(pair + 16 * (b & 1))), q8 = _mm_srli_si128(q, 8);
        const __m128i h = _mm_loadu_si128((const __m128i *)(pair + 32)), h8 = _mm_srli_si128(h, 8);
        const float d0 = S[0] * (float)scale[0], d1 = S[0] * (float)scale[1];
        lo->a = q6_8(q, 0, h, sh, d0);
        lo->b = q6_8(q8, 0, h8, sh, d0);
        hi->a = q6_8(q, 4, h, 4 + sh, d1);
        hi->b = q6_8(q8, 4, h8, 4 + sh, d1);
    } else if (fmt == SK_Q8_0) {
        const __m256 d = _mm256_set1_ps(w->sc[b]);
        const uint8_t *q = w->qs + 32 * b;
        __m256 v[4];
        for (int i = 0; i < 4; i++)
            v[i] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + 8 * i)))), d);
        lo->a = v[0]; lo->b = v[1]; hi->a = v[2]; hi->b = v[3];
    } else {
        const float *f = (const float *)w->qs + (size_t)n * w->k + (size_t)kb * 32;
        *lo = v16_load(f);
        *hi = v16_load(f + 16);
    }
}
#endif

static void dq_row(const sk_w *w, int n, float *out) {
    v16 lo, hi;
    for (int kb = 0; kb < w->k / 32; kb++) {
        dq_block(w->fmt, w, n, kb, &lo, &hi);
        v16_store(out + kb * 32, lo);
        v16_store(out + kb * 32 + 16, hi);
    }
}

/* The hardware prefetcher alone kept a core at about half the memory bandwidth on the weight
 * streams (the 210 layer matmuls of a batch-1 step: 7.0 ms without these prefetches, 5.1 ms with,
 * same process and data; AMX strips 16 rows ahead: 16-row matmuls 12.3 -> 10.1 ms). */
#define SK_PREFETCH_AHEAD 2048 /* bytes of qs ahead of the rows being multiplied */
#define SK_STRIP_AHEAD 16      /* rows ahead of the one being dequantized into a strip */

static int qs_block_bytes(int fmt) {
    switch (fmt) {
    case SK_Q8_0: return 32;
    case SK_F32: return 128;
    case SK_F16: case SK_BFLOAT16: return 64;
    case SK_Q6_K: return 24;
    case SK_Q5_K: return 20;
    default: return 16;
    }
}
static int sc_block_bytes(int fmt) {
    switch (fmt) {
    case SK_Q8_0: return 4;
    case SK_F32: case SK_F16: case SK_BFLOAT16: return 0;
    case SK_Q4_K: case SK_Q5_K: case SK_Q6_K: return 3;
    default: return 8;
    }
}

/* Memory a step streams through (the LM head's copies): 2 MB-aligned and advised to take 2 MB pages,
 * as arena.py places the weights (why: there); free() releases it. NULL where memory ran out. */
static void *stream_alloc(size_t bytes) {
    const size_t huge = (size_t)2 << 20, size = (bytes + huge - 1) / huge * huge;
    void *p = aligned_alloc(huge, size ? size : huge);
    if (p) madvise(p, size, MADV_HUGEPAGE); /* only advice: 4 KB pages where the kernel declines */
    return p;
}

/* prefetcht0 as a volatile asm: GCC 12 deletes a loop of _mm_prefetch calls once it is inlined */
INLINE void prefetch(const void *p) { __asm__ volatile("prefetcht0 %0" : : "m"(*(const char *)p)); }

/* The lines of rows [n, n + count) of a weight (both of its arrays) still to prefetch: all at once
 * (prefetch_rows), or a few at a time from inside a kernel's loop (pf_some). A strip's worth issued
 * at once while it is unpacked waited on the line-fill buffers, a third of the unpacking's time; a
 * few each block of the int16 kernel's passes overlap its products instead (sk_int16.h). */
typedef struct {
    const char *q, *qe, *s, *se;
} sk_pf;

static inline sk_pf pf_rows(const sk_w *w, int n, int count) {
    if (n + count > w->n) count = w->n - n;
    if (count < 0) count = 0;
    const size_t nb = w->k / 32, qb = qs_block_bytes(w->fmt), sb = sc_block_bytes(w->fmt);
    const char *q = (const char *)w->qs + (size_t)n * nb * qb, *s = (const char *)w->sc + (size_t)n * nb * sb;
    return (sk_pf){q, q + count * nb * qb, s, s + count * nb * sb};
}

static inline size_t pf_lines(const sk_pf *p) { return (size_t)(p->qe - p->q + 63) / 64 + (size_t)(p->se - p->s + 63) / 64; }

/* lines of p to prefetch each of `blocks` kernel blocks so that all are issued by the last */
static inline size_t pf_spread(const sk_pf *p, size_t blocks) { return (pf_lines(p) + blocks - 1) / blocks; }

/* the next `lines` lines of p */
INLINE void pf_some(sk_pf *p, size_t lines) {
    for (; lines && p->q < p->qe; lines--, p->q += 64) prefetch(p->q);
    for (; lines && p->s < p->se; lines--, p->s += 64) prefetch(p->s);
}

/* pull rows [n, n + count) of a weight towards the L1 */
static inline void prefetch_rows(const sk_w *w, int n, int count) {
    sk_pf p = pf_rows(w, n, count);
    pf_some(&p, SIZE_MAX);
}

#endif
