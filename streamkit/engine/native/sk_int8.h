/* The batched int8 path (AVX-512 VNNI, the avx512 build): activations quantized to int8 per block
 * of 32 values (one fp32 scale a block, as llama.cpp's Q8_0 activations), weights kept as their
 * unsigned 4- or 8-bit integers, products summed by vpdpbusd (64 multiply-adds an instruction,
 * against 16 for an fp32 FMA and 32 for vdpbf16ps) and scaled per block in fp32.
 *
 * Every format here is "u8 values with a scale and an offset per block of 32": value = s0 * u + s1
 *   Q4_1: u = q, s0 = d, s1 = m;  Q4_0: u = q, s0 = d, s1 = -8 d;  Q4_K: s0 = d * scale, s1 = -dmin * min;
 *   Q8_0: u = q + 128 (int8 -> uint8), s0 = d, s1 = -128 d.
 * so sum_k value_k * x_k = s0 * dx * sum_k u_k qx_k + s1 * dx * sum_k qx_k, with x_k ~ dx * qx_k.
 * (Q6_K and F32 weights take the bf16 or fp32 paths.)
 *
 * Two-term activations (SK_I8_TWO): x ~ dx1 * qx1 + dx2 * qx2, the second int8 term quantizing
 * what the first left (per block of 32 as well): about 15 bits of each value, more than bf16's 8,
 * for twice the vpdpbusd (the weight broadcasts are shared). One term alone is llama.cpp's scheme.
 *
 * Layouts: a strip of 16 output columns is unpacked once per step to u8 [K/32][16 columns][32] and
 * scales s0, s1 [K/32][16]; x to tiles of 16 rows, [16-row tile][K/32][8 groups of 4 k][16 rows][4]
 * int8 with dx and dx * sum(qx) [16-row tile][K/32][16]. A 16-row tile times 8 columns keeps 8
 * int32 and 8 fp32 accumulators (lanes = rows), each weight dword broadcast from the strip.
 * (The avx2 build's batched steps take int16 activations and int16 strips instead: sk_int16.h.)
 * Included by sk_kernels.c only, where SK_VNNI (or SK_I16, for the strips) is set. */
#ifndef SK_INT8_H
#define SK_INT8_H

INLINE int i8_format(int fmt) { return fmt == SK_Q4_1 || fmt == SK_Q4_0 || fmt == SK_Q4_K || fmt == SK_Q8_0; }

#define SK_I8_TWO 32 /* the i8_mask bit: activations as two int8 terms */

#if SK_VNNI /* the activations' int8 packing */
/* one int8 term of the 32 values v into tile[g * 16] (g = 0..7: dword g holds values 4g..4g+3), its
 * scale and scale * sum; v <- what this term leaves (v - d * q), for a second term. The few-row
 * path's quantizer (sk_gemv.h: amax_n, quant32) does the arithmetic; this only lays it out. */
INLINE void i8_quant32(float *v, uint32_t *tile, float *d_out, float *ds_out) {
    const float amax = amax_n(v, 32);
    const float d = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
    uint32_t q[8]; /* 32 int8 in natural order */
    int sum_lo, sum_hi;
    quant32(v, d, id, (int8_t *)q, (int8_t *)q + 16, &sum_lo, &sum_hi);
    for (int g = 0; g < 8; g++) tile[g * 16] = q[g];
    *d_out = d;
    *ds_out = d * (float)(sum_lo + sum_hi);
}

/* bytes of the packed x of M rows of K inputs, one or two terms (fits in xb_elems(M, K) * 4 bytes) */
static size_t i8_x_bytes(int M, int K, int two) {
    return (size_t)((M + 15) / 16) * (K / 32) * (512 + 2 * 64) * (two ? 2 : 1);
}

/* x [M][K] fp32 -> int8 tiles (see above), this thread's share of whole tiles; the second
 * term (two) at xq + MT * NB * 512, dx + 2 MT * NB * 16 */
static void i8_pack_x_team(const float *x, int ldx, int M, int K, uint8_t *xq, float *dx, float *dxs, int two,
                           sk_team *t) {
    const int NB = K / 32, MT = (M + 15) / 16;
    const size_t t2 = (size_t)MT * NB * 512, s2 = (size_t)2 * MT * NB * 16;
    int j0, j1;
    /* whole tiles (16 rows of one block) per thread: a tile's cache lines interleave its 16 rows,
     * so splitting by rows had both threads writing every line (down projection, 16 rows, two
     * terms: 122 us on 1 thread, 114 on 2) */
    team_span(t, MT * NB, &j0, &j1);
    for (int i = j0 * 16; i < j1 * 16; i++) {
        const int j = i / 16, mt = j / NB, kb = j % NB, m = i % 16, row = mt * 16 + m;
        uint32_t *tile = (uint32_t *)(xq + ((size_t)mt * NB + kb) * 512);
        const size_t si = ((size_t)mt * NB + kb) * 16 + m;
        if (row >= M) { /* padding rows: zeros */
            for (int g = 0; g < 8; g++) tile[g * 16 + m] = 0;
            dx[si] = dxs[si] = 0.0f;
            if (two) {
                for (int g = 0; g < 8; g++) tile[t2 / 4 + g * 16 + m] = 0;
                dx[s2 + si] = dxs[s2 + si] = 0.0f;
            }
            continue;
        }
        float v[32] __attribute__((aligned(64)));
        memcpy(v, x + (size_t)row * ldx + kb * 32, sizeof v);
        i8_quant32(v, tile + m, dx + si, dxs + si);
        if (two) i8_quant32(v, tile + t2 / 4 + m, dx + s2 + si, dxs + s2 + si);
    }
}

#endif

/* 16 columns from n0 -> [K/32][16][32] values with s0 / s1 [K/32][16]: u8 for the int8 kernels
 * below (Q8_0 as q + 128), int16 for sk_int16.h's in the avx2 build (written in the same pass:
 * widening a u8 strip afterwards was a second pass over it). The int16 strip holds Q8_0 as its
 * signed q and Q4_0 as q - 8, so neither has an offset, and the kernel reads the Q4_1, Q4_0 and
 * Q8_0 scales where the weight keeps them (sk_dequant.h, weight_scales): only Q4_K's are written, the
 * scattered scale stores having been a quarter of the unpacking. */
#if SK_I16
typedef int16_t strip_t;
#else
typedef uint8_t strip_t;
#endif
INLINE void strip_cols(int fmt, const sk_w *wp, int n0, strip_t *u, float *s0, float *s1, int ahead) {
    const sk_w lw = *wp, *w = &lw; /* a local copy: the scale stores below cannot alias it */
    const int NB = w->k / 32, scales = !SK_I16 || fmt == SK_Q4_K;
    const __m128i m4 = _mm_set1_epi8(0x0F);
    for (int c = 0; c < 16; c++) {
        if (ahead) prefetch_rows(w, n0 + c + SK_STRIP_AHEAD, 1);
        size_t b = (size_t)(n0 + c) * NB;
        for (int kb = 0; kb < NB; kb++, b++) {
            strip_t *dst = u + ((size_t)kb * 16 + c) * 32;
            __m128i v0, v1; /* values 0..15, 16..31 */
            if (fmt == SK_Q8_0) {
                const __m128i *q = (const __m128i *)(w->qs + 32 * b);
                v0 = _mm_loadu_si128(q);
                v1 = _mm_loadu_si128(q + 1);
            } else {
                const __m128i q = _mm_loadu_si128((const __m128i *)(w->qs + 16 * b));
                v0 = _mm_and_si128(q, m4);
                v1 = _mm_and_si128(_mm_srli_epi16(q, 4), m4);
            }
#if SK_I16
            const __m256i off = _mm256_set1_epi16(fmt == SK_Q4_0 ? 8 : 0);
            const __m256i w0 = fmt == SK_Q8_0 ? _mm256_cvtepi8_epi16(v0) : _mm256_cvtepu8_epi16(v0);
            const __m256i w1 = fmt == SK_Q8_0 ? _mm256_cvtepi8_epi16(v1) : _mm256_cvtepu8_epi16(v1);
            _mm256_storeu_si256((__m256i *)dst, _mm256_sub_epi16(w0, off));
            _mm256_storeu_si256((__m256i *)(dst + 16), _mm256_sub_epi16(w1, off));
#else
            const __m128i flip = _mm_set1_epi8(fmt == SK_Q8_0 ? (char)0x80 : 0);
            _mm_storeu_si128((__m128i *)dst, _mm_xor_si128(v0, flip));
            _mm_storeu_si128((__m128i *)(dst + 16), _mm_xor_si128(v1, flip));
#endif
            if (!scales) continue;
            float a, o;
            if (fmt == SK_Q8_0) a = w->sc[b], o = -128.0f * a;
            else q4_scales(fmt, w, b, &a, &o);
            if (fmt == SK_Q4_0) o = -8.0f * a;
            s0[(size_t)kb * 16 + c] = a;
            s1[(size_t)kb * 16 + c] = o;
        }
    }
}

/* ahead: prefetch the next strip's rows while unpacking (else the caller does, pf_rows) */
static void strip_any(const sk_w *w, int n0, strip_t *u, float *s0, float *s1, int ahead) {
    switch (w->fmt) {
    case SK_Q4_1: strip_cols(SK_Q4_1, w, n0, u, s0, s1, ahead); break;
    case SK_Q4_0: strip_cols(SK_Q4_0, w, n0, u, s0, s1, ahead); break;
    case SK_Q4_K: strip_cols(SK_Q4_K, w, n0, u, s0, s1, ahead); break;
    default: strip_cols(SK_Q8_0, w, n0, u, s0, s1, ahead); break;
    }
}

#if SK_VNNI /* the kernels */
/* 8 columns (c0..c0+7 of the strip) of one 16-row tile: out[c] = column c's 16 rows; two: x has a
 * second term (tile at xt + t2, scales at dx + s2), multiplied with the same weight broadcasts */
INLINE void i8_tile8(const uint8_t *u, const float *s0, const float *s1, const uint8_t *xt, const float *dx,
                     const float *dxs, int NB, int c0, float *out, int two, size_t t2, size_t s2) {
    __m512 f[8];
    for (int c = 0; c < 8; c++) f[c] = _mm512_setzero_ps();
    for (int kb = 0; kb < NB; kb++) {
        const uint32_t *uk = (const uint32_t *)(u + (size_t)kb * 512) + c0 * 8;
        const __m512i *xk = (const __m512i *)(xt + (size_t)kb * 512), *xk2 = (const __m512i *)(xt + t2 + (size_t)kb * 512);
        __m512i acc[8], acc2[8];
        for (int c = 0; c < 8; c++) acc[c] = acc2[c] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int g = 0; g < 8; g++) {
            const __m512i xv = _mm512_loadu_si512(xk + g);
            if (two) {
                const __m512i xv2 = _mm512_loadu_si512(xk2 + g);
#pragma GCC unroll 8
                for (int c = 0; c < 8; c++) {
                    const __m512i wb = _mm512_set1_epi32((int)uk[c * 8 + g]);
                    acc[c] = _mm512_dpbusd_epi32(acc[c], wb, xv);
                    acc2[c] = _mm512_dpbusd_epi32(acc2[c], wb, xv2);
                }
            } else {
#pragma GCC unroll 8
                for (int c = 0; c < 8; c++) acc[c] = _mm512_dpbusd_epi32(acc[c], _mm512_set1_epi32((int)uk[c * 8 + g]), xv);
            }
        }
        const float *a = s0 + (size_t)kb * 16 + c0, *o = s1 + (size_t)kb * 16 + c0;
        const __m512 d = _mm512_loadu_ps(dx + (size_t)kb * 16);
        __m512 ds = _mm512_loadu_ps(dxs + (size_t)kb * 16);
        if (two) {
            const __m512 d2 = _mm512_loadu_ps(dx + s2 + (size_t)kb * 16);
            ds = _mm512_add_ps(ds, _mm512_loadu_ps(dxs + s2 + (size_t)kb * 16));
            for (int c = 0; c < 8; c++) {
                const __m512 v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc2[c]), d2, _mm512_mul_ps(_mm512_cvtepi32_ps(acc[c]), d));
                f[c] = _mm512_fmadd_ps(v, _mm512_set1_ps(a[c]), _mm512_fmadd_ps(ds, _mm512_set1_ps(o[c]), f[c]));
            }
        } else {
            for (int c = 0; c < 8; c++)
                f[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[c]), _mm512_mul_ps(d, _mm512_set1_ps(a[c])),
                                       _mm512_fmadd_ps(ds, _mm512_set1_ps(o[c]), f[c]));
        }
    }
    for (int c = 0; c < 8; c++) _mm512_store_ps(out + c * 16, f[c]);
}

/* y [M][ldy] (+)= x . W^T on the int8 path; xbuf: i8_x_bytes(M, K, two) bytes shared by the team */
static void mm_i8_team(const sk_w *w, int M, const float *x, int ldx, void *xbuf, float *y, int ldy, int acc,
                       int two, sk_team *t) {
    const int N = w->n, K = w->k, NB = K / 32, MT = (M + 15) / 16;
    const size_t t2 = (size_t)MT * NB * 512, s2 = (size_t)2 * MT * NB * 16;
    uint8_t *xq = xbuf;
    float *dx = (float *)(xq + (two ? 2 : 1) * t2), *dxs = dx + (size_t)MT * NB * 16;
    share_begin(t, N / 16);
    i8_pack_x_team(x, ldx, M, K, xq, dx, dxs, two, t);
    team_barrier(t);
    uint8_t *u = strip_buffer((size_t)16 * K + 2 * (size_t)16 * NB * 4);
    float *s0 = (float *)(u + (size_t)16 * K), *s1 = s0 + (size_t)16 * NB;
    float ctile[16 * 16] __attribute__((aligned(64)));
    int a0, a1;
    while (share_next(t, 1, 1, &a0, &a1)) {
        const int n0 = a0 * 16;
        strip_any(w, n0, u, s0, s1, 1);
        for (int mt = 0; mt < MT; mt++) {
            const size_t ti = (size_t)mt * NB;
            const int rows = M - mt * 16 < 16 ? M - mt * 16 : 16;
            if (two) {
                i8_tile8(u, s0, s1, xq + ti * 512, dx + ti * 16, dxs + ti * 16, NB, 0, ctile, 1, t2, s2);
                i8_tile8(u, s0, s1, xq + ti * 512, dx + ti * 16, dxs + ti * 16, NB, 8, ctile + 128, 1, t2, s2);
            } else {
                i8_tile8(u, s0, s1, xq + ti * 512, dx + ti * 16, dxs + ti * 16, NB, 0, ctile, 0, 0, 0);
                i8_tile8(u, s0, s1, xq + ti * 512, dx + ti * 16, dxs + ti * 16, NB, 8, ctile + 128, 0, 0, 0);
            }
            __m512 r[16];
            for (int i = 0; i < 16; i++) r[i] = _mm512_load_ps(ctile + i * 16);
            store_tile(r, y + (size_t)mt * 16 * ldy + n0, ldy, rows, acc);
        }
    }
}

#endif /* SK_VNNI */

#endif
