/* 16-float vectors for the native kernels, on either instruction set they are built for:
 *   AVX-512F: one zmm register (v16 = __m512);
 *   AVX2 + FMA + F16C (no AVX-512): a pair of ymm registers.
 * The kernels' blocks are 32 values (two v16) and attention walks head_dim in steps of 16, so most
 * code is written once against these helpers. Code that only exists for one instruction set (the
 * bf16 strips, AMX) uses the intrinsics directly. Included by sk_kernels.c only. */
#ifndef SK_VEC_H
#define SK_VEC_H

#include <immintrin.h>
#include <stdint.h>

#define INLINE static inline __attribute__((always_inline))

#ifdef __AVX512F__
typedef __m512 v16;
typedef __m512 vacc; /* the accumulator of a dot product: 16 lanes here, 8 on AVX2 */
INLINE v16 v16_zero(void) { return _mm512_setzero_ps(); }
INLINE v16 v16_set1(float a) { return _mm512_set1_ps(a); }
INLINE v16 v16_load(const float *p) { return _mm512_loadu_ps(p); }
INLINE void v16_store(float *p, v16 a) { _mm512_storeu_ps(p, a); }
INLINE v16 v16_add(v16 a, v16 b) { return _mm512_add_ps(a, b); }
INLINE v16 v16_sub(v16 a, v16 b) { return _mm512_sub_ps(a, b); }
INLINE v16 v16_mul(v16 a, v16 b) { return _mm512_mul_ps(a, b); }
INLINE v16 v16_div(v16 a, v16 b) { return _mm512_div_ps(a, b); }
INLINE v16 v16_max(v16 a, v16 b) { return _mm512_max_ps(a, b); }
INLINE v16 v16_fmadd(v16 a, v16 b, v16 c) { return _mm512_fmadd_ps(a, b, c); }
/* bit i set where lane i of a >= b (false where either is NaN) */
INLINE int v16_ge_mask(v16 a, v16 b) { return (int)_mm512_cmp_ps_mask(a, b, _CMP_GE_OQ); }
INLINE int v16_gt_mask(v16 a, v16 b) { return (int)_mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }
INLINE float v16_hsum(v16 a) { return _mm512_reduce_add_ps(a); }
INLINE float v16_hmax(v16 a) { return _mm512_reduce_max_ps(a); }
/* a with lanes n..15 zeroed (0 <= n <= 16) */
INLINE v16 v16_keep(v16 a, int n) {
    return _mm512_maskz_mov_ps(n >= 16 ? (__mmask16)0xFFFF : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1), a);
}
/* 16 float16 values as float32 */
INLINE v16 v16_load_half(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
/* 16 int8 values as float32 */
INLINE v16 v16_load_i8(const int8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
/* the unnormalized Walsh-Hadamard transform of the 16 lanes: lane j of each stage h is x[j] + x[j ^ h]
 * where bit h of j is clear, x[j ^ h] - x[j] where it is set */
INLINE v16 v16_fwht16(v16 x) {
    v16 y = _mm512_permute_ps(x, 0xB1);
    x = _mm512_mask_sub_ps(_mm512_add_ps(x, y), 0xAAAA, y, x);
    y = _mm512_permute_ps(x, 0x4E);
    x = _mm512_mask_sub_ps(_mm512_add_ps(x, y), 0xCCCC, y, x);
    y = _mm512_shuffle_f32x4(x, x, 0xB1);
    x = _mm512_mask_sub_ps(_mm512_add_ps(x, y), 0xF0F0, y, x);
    y = _mm512_shuffle_f32x4(x, x, 0x4E);
    return _mm512_mask_sub_ps(_mm512_add_ps(x, y), 0xFF00, y, x);
}
INLINE void v16_store_half(uint16_t *p, v16 a) {
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT));
}
INLINE vacc vacc_zero(void) { return _mm512_setzero_ps(); }
/* acc + xl . lo + xh . hi (one 32-value block) */
INLINE vacc vacc_dot2(vacc acc, v16 xl, v16 lo, v16 xh, v16 hi) { return _mm512_fmadd_ps(xh, hi, _mm512_fmadd_ps(xl, lo, acc)); }
INLINE float vacc_hsum(vacc a) { return _mm512_reduce_add_ps(a); }

/* exp for the softmax and SiLU: Cephes' single-precision polynomial (about 1 ulp) */
INLINE v16 v16_exp(v16 x) {
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

/* y (+)= the 16 x 16 block r (transposed: r[c] holds column c of rows 0..15) for `rows` rows */
INLINE void store_tile(__m512 r[16], float *y, int ldy, int rows, int acc) {
    transpose16(r); /* the tile is [output column][row of x]; y wants rows */
    for (int m = 0; m < rows; m++) {
        float *o = y + (size_t)m * ldy;
        _mm512_storeu_ps(o, acc ? _mm512_add_ps(_mm512_loadu_ps(o), r[m]) : r[m]);
    }
}

#else /* AVX2 + FMA + F16C */
#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "the streamkit native kernels need AVX2, FMA and F16C (or AVX-512F)"
#endif
typedef struct {
    __m256 a, b; /* lanes 0..7, 8..15 */
} v16;
typedef __m256 vacc;
INLINE v16 v16_make(__m256 a, __m256 b) { v16 r = {a, b}; return r; }
INLINE v16 v16_zero(void) { return v16_make(_mm256_setzero_ps(), _mm256_setzero_ps()); }
INLINE v16 v16_set1(float x) { return v16_make(_mm256_set1_ps(x), _mm256_set1_ps(x)); }
INLINE v16 v16_load(const float *p) { return v16_make(_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)); }
INLINE void v16_store(float *p, v16 x) { _mm256_storeu_ps(p, x.a); _mm256_storeu_ps(p + 8, x.b); }
#define SK_V16_OP2(name, op) \
    INLINE v16 name(v16 x, v16 y) { return v16_make(op(x.a, y.a), op(x.b, y.b)); }
SK_V16_OP2(v16_add, _mm256_add_ps)
SK_V16_OP2(v16_sub, _mm256_sub_ps)
SK_V16_OP2(v16_mul, _mm256_mul_ps)
SK_V16_OP2(v16_div, _mm256_div_ps)
SK_V16_OP2(v16_max, _mm256_max_ps)
INLINE v16 v16_fmadd(v16 x, v16 y, v16 z) { return v16_make(_mm256_fmadd_ps(x.a, y.a, z.a), _mm256_fmadd_ps(x.b, y.b, z.b)); }
INLINE int v16_ge_mask(v16 x, v16 y) {
    return _mm256_movemask_ps(_mm256_cmp_ps(x.a, y.a, _CMP_GE_OQ)) |
           _mm256_movemask_ps(_mm256_cmp_ps(x.b, y.b, _CMP_GE_OQ)) << 8;
}
INLINE int v16_gt_mask(v16 x, v16 y) {
    return _mm256_movemask_ps(_mm256_cmp_ps(x.a, y.a, _CMP_GT_OQ)) |
           _mm256_movemask_ps(_mm256_cmp_ps(x.b, y.b, _CMP_GT_OQ)) << 8;
}
INLINE float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
INLINE float v16_hsum(v16 x) { return hsum8(_mm256_add_ps(x.a, x.b)); }
INLINE float v16_hmax(v16 x) {
    __m256 m = _mm256_max_ps(x.a, x.b);
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
INLINE v16 v16_keep(v16 x, int n) {
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i lim = _mm256_set1_epi32(n);
    const __m256 ma = _mm256_castsi256_ps(_mm256_cmpgt_epi32(lim, iota));
    const __m256 mb = _mm256_castsi256_ps(_mm256_cmpgt_epi32(lim, _mm256_add_epi32(iota, _mm256_set1_epi32(8))));
    return v16_make(_mm256_and_ps(x.a, ma), _mm256_and_ps(x.b, mb));
}
INLINE v16 v16_load_i8(const int8_t *p) {
    const __m128i q = _mm_loadu_si128((const __m128i *)p);
    return v16_make(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8))));
}
INLINE __m256 fwht8(__m256 x) {
    __m256 y = _mm256_permute_ps(x, 0xB1);
    x = _mm256_blend_ps(_mm256_add_ps(x, y), _mm256_sub_ps(y, x), 0xAA);
    y = _mm256_permute_ps(x, 0x4E);
    x = _mm256_blend_ps(_mm256_add_ps(x, y), _mm256_sub_ps(y, x), 0xCC);
    y = _mm256_permute2f128_ps(x, x, 0x01);
    return _mm256_blend_ps(_mm256_add_ps(x, y), _mm256_sub_ps(y, x), 0xF0);
}
/* the unnormalized Walsh-Hadamard transform of the 16 lanes (as the AVX-512 one) */
INLINE v16 v16_fwht16(v16 x) {
    const __m256 a = fwht8(x.a), b = fwht8(x.b);
    return v16_make(_mm256_add_ps(a, b), _mm256_sub_ps(a, b));
}
INLINE v16 v16_load_half(const uint16_t *p) {
    return v16_make(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)),
                    _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 8))));
}
INLINE void v16_store_half(uint16_t *p, v16 x) {
    _mm_storeu_si128((__m128i *)p, _mm256_cvtps_ph(x.a, _MM_FROUND_TO_NEAREST_INT));
    _mm_storeu_si128((__m128i *)(p + 8), _mm256_cvtps_ph(x.b, _MM_FROUND_TO_NEAREST_INT));
}
/* one 8-lane accumulator per dot product: 16 of them fit the 16 ymm registers' budget better */
INLINE vacc vacc_zero(void) { return _mm256_setzero_ps(); }
/* acc + xl . lo + xh . hi: the block's four products summed apart, so the chain through acc is one
 * add a block (four dependent FMAs made a batch-1 step latency-bound) */
INLINE vacc vacc_dot2(vacc acc, v16 xl, v16 lo, v16 xh, v16 hi) {
    const __m256 t = _mm256_fmadd_ps(xl.b, lo.b, _mm256_mul_ps(xl.a, lo.a));
    return _mm256_add_ps(acc, _mm256_fmadd_ps(xh.b, hi.b, _mm256_fmadd_ps(xh.a, hi.a, t)));
}
INLINE float vacc_hsum(vacc a) { return hsum8(a); }

INLINE __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-88.37626f)), _mm256_set1_ps(88.37626f));
    __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500E-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    /* y * 2^fx in two steps (fx is in [-127, 128]: 2^128 alone does not fit a float's exponent) */
    const __m256i n = _mm256_cvtps_epi32(fx), n1 = _mm256_srai_epi32(n, 1), n2 = _mm256_sub_epi32(n, n1);
    const __m256i bias = _mm256_set1_epi32(127);
    y = _mm256_mul_ps(y, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23)));
    return _mm256_mul_ps(y, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23)));
}
INLINE v16 v16_exp(v16 x) { return v16_make(exp8(x.a), exp8(x.b)); }
#endif

/* A thread's scratch buffers, at least `bytes` each, kept between calls. A thread runs one matmul
 * or one attention at a time, so those share SCRATCH_STRIP (a weight strip and its scales, the
 * few-row kernel's sums between passes, or attention scores: tens to hundreds of KB); the few-row
 * kernel's x packed by a thread for itself (SCRATCH_PACK) and the fp32 rows it packs them from
 * (SCRATCH_ROWS) outlive a matmul's start, so they have their own. */
enum { SCRATCH_STRIP, SCRATCH_ROWS, SCRATCH_PACK, SCRATCH_SLOTS };
static __thread void *t_scratch[SCRATCH_SLOTS];
static __thread size_t t_scratch_cap[SCRATCH_SLOTS];

static void *thread_buffer(int slot, size_t bytes) {
    if (t_scratch_cap[slot] < bytes) {
        free(t_scratch[slot]);
        t_scratch[slot] = aligned_alloc(64, (bytes + 63) / 64 * 64);
        if (!t_scratch[slot]) abort(); /* nothing sensible is left to do */
        t_scratch_cap[slot] = bytes;
    }
    return t_scratch[slot];
}

static void *strip_buffer(size_t bytes) { return thread_buffer(SCRATCH_STRIP, bytes); }

#endif
