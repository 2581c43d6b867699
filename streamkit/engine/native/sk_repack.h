/* Conversions at load. GGUF K-quant super-blocks -> the kernels' SK_Q4_K / SK_Q5_K / SK_Q6_K layouts
 * (sk_dequant.h): byte shuffles only, so every value is the file's (the dequantization tests check
 * the packed weights against gguf's dequantize bit for bit). And a draft model's weights narrowed to
 * GGUF Q4_0 blocks (draft.py), byte for byte as gguf-py's quantizer writes them. Done in numpy until
 * 2026-12-07: the repack of the 1.5B's 1,058 MB of Q4_K / Q6_K took 9.4 s of its 27 s load, the
 * 0.5B draft's narrowing 7.8 s (Intel Xeon with AMX); here 0.73 and 0.6-0.8 s.
 * Included by sk_kernels.c only (after sk_dequant.h). */
#ifndef SK_REPACK_H
#define SK_REPACK_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* bytes of a GGUF super-block, and of its values in the kernels' qs */
#define RP_Q4_K_BYTES 144
#define RP_Q5_K_BYTES 176
#define RP_Q6_K_BYTES 210

static float rp_f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* 32 values 0..15 as Q4_1's 16 nibble bytes: value i low, value i + 16 high (the repacks here and
 * sk_head4.h's copies) */
static void rp_nibbles(const uint8_t *v, uint8_t *out) {
    for (int i = 0; i < 16; i++) out[i] = (uint8_t)((v[i] & 15) | (v[i + 16] & 15) << 4);
}

/* Q4_K / Q5_K's 12 bytes of 6-bit scale / min pairs, unpacked (llama.cpp's get_scale_min_k4), and
 * the super-block's d and dmin: the 24 bytes of the kernels' sc */
static void rp_k_scales(const uint8_t *b, float *sc) {
    const uint8_t *s = b + 4;
    uint8_t *u = (uint8_t *)(sc + 2);
    sc[0] = rp_f16(b);
    sc[1] = rp_f16(b + 2);
    for (int j = 0; j < 8; j++) {
        u[j] = j < 4 ? s[j] & 63 : (uint8_t)((s[j + 4] & 15) | (s[j - 4] >> 6) << 4);
        u[8 + j] = j < 4 ? s[j + 4] & 63 : (uint8_t)((s[j + 4] >> 4) | (s[j] >> 6) << 4);
    }
}

/* the low 4 bits of a Q4_K / Q5_K super-block's 256 values: block 2j the low nibbles of bytes
 * 32j.., block 2j + 1 their high nibbles */
static void rp_k_low4(const uint8_t *ql, uint8_t v[256]) {
    for (int j = 0; j < 4; j++)
        for (int l = 0; l < 32; l++) {
            v[64 * j + l] = ql[32 * j + l] & 15;
            v[64 * j + 32 + l] = ql[32 * j + l] >> 4;
        }
}

static void rp_q4_k(const uint8_t *b, uint8_t *qs, float *sc) {
    uint8_t v[256];
    rp_k_scales(b, sc);
    rp_k_low4(b + 16, v);
    for (int k = 0; k < 8; k++) rp_nibbles(v + 32 * k, qs + 16 * k);
}

/* qs per block: the nibbles, then a uint32 with value i's fifth bit (bit k of the file's byte i
 * for block k) at bit i */
static void rp_q5_k(const uint8_t *b, uint8_t *qs, float *sc) {
    uint8_t v[256];
    rp_k_scales(b, sc);
    rp_k_low4(b + 48, v);
    for (int k = 0; k < 8; k++) {
        uint32_t bits = 0;
        for (int i = 0; i < 32; i++) bits |= (uint32_t)(b[16 + i] >> k & 1) << i;
        rp_nibbles(v + 32 * k, qs + 20 * k);
        memcpy(qs + 20 * k + 16, &bits, 4);
    }
}

/* the file's 6-bit values in natural order (gguf's Q6_K: two halves of 128, each from 64 bytes of
 * low nibbles and 32 of high bit pairs); per pair of blocks (A, B) A's nibbles, B's, then the high
 * pairs as sk_dequant.h lays them out; sc: float d, 4 zero bytes, the 16 int8 scales */
static void rp_q6_k(const uint8_t *b, uint8_t *qs, float *sc) {
    uint8_t v[256];
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
        uint8_t *o = v + 128 * h;
        for (int l = 0; l < 32; l++) {
            o[l] = (uint8_t)((ql[l] & 15) | (qh[l] & 3) << 4);
            o[l + 32] = (uint8_t)((ql[l + 32] & 15) | (qh[l] >> 2 & 3) << 4);
            o[l + 64] = (uint8_t)((ql[l] >> 4) | (qh[l] >> 4 & 3) << 4);
            o[l + 96] = (uint8_t)((ql[l + 32] >> 4) | (qh[l] >> 6 & 3) << 4);
        }
    }
    for (int p = 0; p < 4; p++) {
        const uint8_t *A = v + 64 * p, *B = A + 32;
        uint8_t *o = qs + 48 * p;
        rp_nibbles(A, o);
        rp_nibbles(B, o + 16);
        for (int j = 0; j < 16; j++)
            o[32 + j] = (uint8_t)((A[j] >> 4) | (B[j] >> 4) << 2 | (A[16 + j] >> 4) << 4 | (B[16 + j] >> 4) << 6);
    }
    sc[0] = rp_f16(b + 208);
    memset(sc + 1, 0, 4);
    memcpy(sc + 2, b + 192, 16);
}

/* 32 values -> a GGUF Q4_0 block (f16 d, 16 nibble bytes) as gguf-py's Q4_0.quantize_blocks makes it
 * in float32: d = (the first value of the largest magnitude) / -8, q = trunc(x * (1 / d) + 8.5)
 * clipped to 0..15. In AVX2 (every path has it): scalar C took 4.6 ns a value. */
static void rp_q4_0(const float *x, uint8_t *out) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v[4], m = _mm256_setzero_ps();
    for (int i = 0; i < 4; i++) v[i] = _mm256_loadu_ps(x + 8 * i), m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[i]));
    m = _mm256_max_ps(m, _mm256_permute2f128_ps(m, m, 1));
    m = _mm256_max_ps(m, _mm256_shuffle_ps(m, m, 0x4e));
    m = _mm256_max_ps(m, _mm256_shuffle_ps(m, m, 0xb1));
    unsigned at = 0; /* the first of that magnitude: a block of zeros keeps x[0]'s sign, as numpy's argmax */
    for (int i = 3; i >= 0; i--)
        at = at << 8 | (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign, v[i]), m, _CMP_EQ_OQ));
    const float d = x[at ? __builtin_ctz(at) : 0] / -8.0f, id = d == 0.0f ? 0.0f : 1.0f / d;
    const uint16_t h = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
    __m256i q[4];
    for (int i = 0; i < 4; i++) {
        const __m256 t = _mm256_round_ps(_mm256_add_ps(_mm256_mul_ps(v[i], _mm256_set1_ps(id)), _mm256_set1_ps(8.5f)),
                                         _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
        q[i] = _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(t, _mm256_setzero_ps()), _mm256_set1_ps(15.0f)));
    }
    /* packs interleave 128-bit lanes; the permute puts the 32 values back in order */
    const __m256i p = _mm256_permutevar8x32_epi32(
        _mm256_packus_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3])),
        _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    const __m128i nib = _mm_or_si128(_mm256_castsi256_si128(p), _mm_slli_epi16(_mm256_extracti128_si256(p, 1), 4));
    memcpy(out, &h, 2);
    _mm_storeu_si128((__m128i *)(out + 2), nib);
}

/* a GGUF Q5_0 block (f16 d, uint32 of fifth bits, 16 nibble bytes) as Q8_0 in the kernels' layout:
 * int8 q - 16 and the scale d, the values gguf's dequantize gives (d * (q - 16)) */
static void rp_q5_0(const uint8_t *b, int8_t *qs, float *d) {
    uint32_t hi;
    memcpy(&hi, b + 2, 4);
    for (int i = 0; i < 16; i++) {
        qs[i] = (int8_t)((b[6 + i] & 15 | (hi >> i & 1) << 4) - 16);
        qs[i + 16] = (int8_t)((b[6 + i] >> 4 | (hi >> (i + 16) & 1) << 4) - 16);
    }
    *d = rp_f16(b);
}

#endif
