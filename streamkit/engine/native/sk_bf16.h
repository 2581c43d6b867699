/* The batched bf16 paths (AVX-512 with AVX512_BF16): a strip of 16 or 32 output columns is
 * dequantized to bf16 once per step and multiplied with every row of the step, packed to bf16
 * too, with fp32 accumulation:
 *   - AMX tiles where the CPU has them and the kernel grants the tile state (SK_AMX);
 *   - otherwise vdpbf16ps: the same strips and packed activations, a 16 x 16 tile of outputs held
 *     in 16 zmm registers, each weight pair broadcast against 16 rows of x (Zen 4/5, Cooper Lake).
 * Both read each weight from memory once per step (the fp32 FMA path: once per 4 rows).
 * Included by sk_kernels.c only, where SK_BF16 is set. */
#ifndef SK_BF16_H
#define SK_BF16_H

/* the order the bf16 paths dequantize a 4-bit block's 32 values in (see dq_strip) */
static const uint16_t Q4_ORDER[32] = {0,  2,  4,  6,  8,  10, 12, 14, 1,  3,  5,  7,  9,  11, 13, 15,
                                      16, 18, 20, 22, 24, 26, 28, 30, 17, 19, 21, 23, 25, 27, 29, 31};

/* words 0..15 (half 0) or 16..31 (half 1) of 32 bf16 values, as fp32: one zero-masked vpermw puts
 * word half * 16 + j in the high half of lane j (instead of extracting, widening and shifting) */
INLINE __m512 bf16_widen(__m512i v, int half) {
    const __m512i idx = _mm512_add_epi16(_mm512_set_epi16(15, 0, 14, 0, 13, 0, 12, 0, 11, 0, 10, 0, 9, 0, 8, 0, 7, 0, 6, 0,
                                                          5, 0, 4, 0, 3, 0, 2, 0, 1, 0, 0, 0),
                                         _mm512_set1_epi16((short)(16 * half)));
    return _mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(0xAAAAAAAAu, idx, v));
}

/* (a, b) rounded to bf16 pairs as hi = cvtne2ps(b, a) did, and what that rounding left, rounded
 * again: hi + lo carries about 16 bits of each value */
INLINE __m512i bf16_rest(__m512 a, __m512 b, __m512i hi) {
    return (__m512i)_mm512_cvtne2ps_pbh(_mm512_sub_ps(b, bf16_widen(hi, 1)), _mm512_sub_ps(a, bf16_widen(hi, 0)));
}

/* bf16 of f, rounded to nearest even (finite f), and the fp32 value of a bf16 */
INLINE uint16_t bf16_round(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

INLINE float bf16_value(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* v as two bf16 terms, v ~ hi + lo (~16 bits) */
INLINE void bf16_split(float v, uint16_t *hi, uint16_t *lo) {
    *hi = bf16_round(v);
    *lo = bf16_round(v - bf16_value(*hi));
}

/* 16 values as two bf16 terms each, v ~ hi + lo */
INLINE void bf16_terms16(__m512 v, __m256i *hi, __m256i *lo) {
    *hi = (__m256i)_mm512_cvtneps_pbh(v);
    const __m512 h = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(*hi), 16));
    *lo = (__m256i)_mm512_cvtneps_pbh(_mm512_sub_ps(v, h));
}

/* ... stored: all 16, or lanes 8..15 */
INLINE void bf16_split16(__m512 v, uint16_t *hi, uint16_t *lo) {
    __m256i h, l;
    bf16_terms16(v, &h, &l);
    _mm256_storeu_si256((__m256i *)hi, h);
    _mm256_storeu_si256((__m256i *)lo, l);
}

INLINE void bf16_split8_high(__m512 v, uint16_t *hi, uint16_t *lo) {
    __m256i h, l;
    bf16_terms16(v, &h, &l);
    _mm_storeu_si128((__m128i *)hi, _mm256_extracti128_si256(h, 1));
    _mm_storeu_si128((__m128i *)lo, _mm256_extracti128_si256(l, 1));
}

/* blocks of K padded to whole tiles of 32 blocks (the layout of pack_sum's tiles) */
INLINE int padded_blocks(int NB) { return (NB + 31) / 32 * 32; }

/* row m's sum of x over block kb, as three bf16 terms (~24 bits: it multiplies the weights' offsets,
 * which may be as large as the products), into "B" tiles over the blocks: sums
 * [MT][padded_blocks(NB) / 32][3 terms][16 pair rows][16 rows][2], block kb at pair row kb % 32 / 2,
 * element kb % 2. With the last block the padding blocks after it are zeroed. */
INLINE void pack_sum(uint16_t *sums, int mt, int NB, int kb, int m, float sum) {
    const int NBp = padded_blocks(NB);
    uint16_t *tiles = sums + (size_t)mt * NBp * 48;
    for (int b = kb; b < (kb == NB - 1 ? NBp : kb + 1); b++) {
        uint16_t *at = tiles + (size_t)(b / 32) * 1536 + ((b % 32 / 2) * 16 + m) * 2 + b % 2;
        at[0] = at[512] = at[1024] = 0;
        if (b == kb) {
            bf16_split(sum, at, at + 512);
            at[1024] = bf16_round(sum - bf16_value(at[0]) - bf16_value(at[512]));
        }
    }
}

/* x [M][K] fp32 -> bf16 "B" tiles [MT][K/32][16 pair rows][16 rows of x][2], zero padded: tile
 * (mt, kb) holds x[mt*16 + m][kb*32 + order[2p + j]] at pair row p, column m, element j, where
 * order is the k order the weight strips are dequantized in (Q4_ORDER for 4-bit weights, else
 * 0..31): any order works as long as both operands share it. xrest (NULL: none): the same tiles of
 * what the rounding to bf16 left (bf16_rest). sums (NULL: none): each row's sum of x per block
 * (pack_sum). */
static void pack_x_team(const float *x, int ldx, int M, int K, int q4, uint32_t *xb, uint32_t *xrest, uint16_t *sums,
                        sk_team *t) {
    const int MT = (M + 15) / 16, NB = K / 32;
    const __m512i stride = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                              _mm512_set1_epi32(16));
    const __m512i order = _mm512_loadu_si512(Q4_ORDER);
    int i0, i1;
    team_span(t, MT * NB, &i0, &i1);
    for (int i = i0; i < i1; i++) {
        const int mt = i / NB, kb = i % NB;
        uint32_t *tile = xb + ((size_t)mt * NB + kb) * 256, *rest = xrest ? xrest + ((size_t)mt * NB + kb) * 256 : NULL;
        for (int m = 0; m < 16; m++) {
            const int row = mt * 16 + m;
            __m512i v = _mm512_setzero_si512(), r = _mm512_setzero_si512();
            float sum = 0.0f;
            if (row < M) {
                const float *p = x + (size_t)row * ldx + kb * 32;
                const __m512 a = _mm512_loadu_ps(p), b = _mm512_loadu_ps(p + 16);
                if (sums) sum = _mm512_reduce_add_ps(_mm512_add_ps(a, b));
                v = (__m512i)_mm512_cvtne2ps_pbh(b, a);
                if (xrest) r = bf16_rest(a, b, v);
                if (q4) {
                    v = _mm512_permutexvar_epi16(order, v);
                    if (xrest) r = _mm512_permutexvar_epi16(order, r);
                }
            }
            if (sums) pack_sum(sums, mt, NB, kb, m, sum);
            _mm512_i32scatter_epi32(tile + m, stride, v, 4);
            if (xrest) _mm512_i32scatter_epi32(rest + m, stride, r, 4);
        }
    }
}

/* The vpermw indices that pick two columns' 4-bit blocks (column a's at q, b's at q + next) from a
 * 32-entry table of words, bit 4 naming the column. They come from one broadcast load of a block's
 * 16 bytes shifted per 128-bit lane by 0, 8, 4, 12 bits: word i of lane l then holds in its low
 * bits the low (l = 0, 1) or high (l = 2, 3) nibble of byte 2i + (l & 1), so the values come out in
 * Q4_ORDER, not 0..31 (no cross-lane shuffle to put them back; x is packed in the same order). */
INLINE void q4_pick_indices(const uint8_t *q, size_t next, __m512i *ia, __m512i *ib) {
    const __m512i shifts = _mm512_set_epi64(0x000c000c000c000cLL, 0x000c000c000c000cLL, 0x0004000400040004LL,
                                            0x0004000400040004LL, 0x0008000800080008LL, 0x0008000800080008LL, 0, 0);
    const __m512i nib = _mm512_set1_epi16(0x0f), col_b = _mm512_set1_epi16(0x10);
    *ia = _mm512_and_si512(_mm512_srlv_epi16(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)q)), shifts), nib);
    *ib = _mm512_ternarylogic_epi32(
        _mm512_srlv_epi16(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(q + next))), shifts), nib, col_b,
        0xEA); /* (x & nib) | col_b */
}

/* dq_strip's 4-bit blocks, two columns at a time. The 16-entry fp32 tables d*j + m of column c's
 * and c + 1's block kb are rounded into one 32-entry bf16 table (one conversion for both) and
 * picked from with vpermw (q4_pick_indices). With rest, what the rounding left is rounded into a
 * second table the same way (bf16_rest) and picked with the same indices. Against one column at a
 * time: the same values, half the conversions, and Q4_K's scales computed a super-block at a time
 * in a vector (a Q4_K matmul on AMX tiles in two terms, 16 rows: 1.2x). With ints, the blocks'
 * integers instead (q, Q4_0's q - 8: exact in bf16), from one constant table (sk_amx4.h). With
 * ahead, the rows SK_STRIP_AHEAD on are prefetched while unpacking; sk_amx4.h instead spreads the
 * next strip's lines over its tile products (prefill steps of the 1.5B 1.03-1.06x; the same in
 * mm_amx_team, for Q6_K, measured no change). */
INLINE void dq_strip_q4(int fmt, const sk_w *w, int n0, uint16_t *buf, size_t col_step, size_t blk_step,
                        uint16_t *rest, int ints, int ahead) {
    const int NB = w->k / 32;
    const __m512 J = _mm512_loadu_ps(fmt == SK_Q4_0 ? J_Q4_0 : J_Q4_1);
    const __m512i int_table = (__m512i)_mm512_cvtne2ps_pbh(J, J); /* both columns' halves */
    const float *sc = w->sc; /* in a register: through w it was reloaded every block, buf may alias */
    for (int c = 0; c < 16; c += 2) {
        const size_t ba = (size_t)(n0 + c) * NB; /* column c's first block; c + 1's is NB later */
        const uint8_t *q = w->qs + ba * 16;
        uint16_t *dst = buf + c * col_step, *rdst = rest ? rest + c * col_step : NULL;
        if (ahead) prefetch_rows(w, n0 + c + SK_STRIP_AHEAD, 2);
        float sa[16], sb[16]; /* Q4_K: the scales of a super-block's 8 blocks, then their offsets */
        for (int kb = 0; kb < NB; kb++, q += 16, dst += blk_step, rdst += rest ? blk_step : 0) {
            __m512i ia, ib;
            q4_pick_indices(q, (size_t)NB * 16, &ia, &ib);
            if (ints) {
                _mm512_storeu_si512(dst, _mm512_permutexvar_epi16(ia, int_table));
                _mm512_storeu_si512(dst + col_step, _mm512_permutexvar_epi16(ib, int_table));
                continue;
            }
            float a0, a1, b0, b1;
            if (fmt == SK_Q4_K) {
                if (!(kb & 7)) {
                    q4k_scales8(sc, ba + kb, sa);
                    q4k_scales8(sc, ba + NB + kb, sb);
                }
                a0 = sa[kb & 7], a1 = sa[8 + (kb & 7)], b0 = sb[kb & 7], b1 = sb[8 + (kb & 7)];
            } else {
                const float *s = sc + (ba + kb) * 2;
                a0 = s[0], a1 = s[1], b0 = s[2 * NB], b1 = s[2 * NB + 1];
            }
            const __m512 ta = _mm512_fmadd_ps(_mm512_set1_ps(a0), J, _mm512_set1_ps(a1));
            const __m512 tb = _mm512_fmadd_ps(_mm512_set1_ps(b0), J, _mm512_set1_ps(b1));
            const __m512i hi = (__m512i)_mm512_cvtne2ps_pbh(tb, ta);
            _mm512_storeu_si512(dst, _mm512_permutexvar_epi16(ia, hi));
            _mm512_storeu_si512(dst + col_step, _mm512_permutexvar_epi16(ib, hi));
            if (rest) {
                const __m512i lo = bf16_rest(ta, tb, hi);
                _mm512_storeu_si512(rdst, _mm512_permutexvar_epi16(ia, lo));
                _mm512_storeu_si512(rdst + col_step, _mm512_permutexvar_epi16(ib, lo));
            }
        }
    }
}

/* 16 weight rows (output columns n0..n0+15) -> bf16 [16][K], the "A" operand of every tile of the
 * strip: 4-bit blocks through dq_strip_q4, the other formats a block at a time (dq_block). */
INLINE void dq_strip(int fmt, const sk_w *w, int n0, uint16_t *buf, int il, uint16_t *rest) {
    /* rest (NULL: none): what the rounding to bf16 left, rounded again, laid out as buf */
    const int K = w->k, NB = K / 32;
    /* il: block-interleaved, [K/32][16 columns][32] (dp_tile), else [16 columns][K] (AMX tiles) */
    const size_t col_step = il ? 32 : (size_t)K, blk_step = il ? 512 : 32;
    if (fmt == SK_Q4_1 || fmt == SK_Q4_0 || fmt == SK_Q4_K) {
        dq_strip_q4(fmt, w, n0, buf, col_step, blk_step, rest, 0, 1);
        return;
    }
    for (int c = 0; c < 16; c++) {
        uint16_t *dst = buf + c * col_step;
        prefetch_rows(w, n0 + c + SK_STRIP_AHEAD, 1);
        for (int kb = 0; kb < NB; kb++) {
            __m512 lo, hi;
            dq_block(fmt, w, n0 + c, kb, &lo, &hi);
            const __m512i v = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
            _mm512_storeu_si512(dst + kb * blk_step, v);
            if (rest) _mm512_storeu_si512(rest + c * col_step + kb * blk_step, bf16_rest(lo, hi, v));
        }
    }
}

static void dq_strip_any(const sk_w *w, int n0, uint16_t *buf, int il, uint16_t *rest) {
    switch (w->fmt) {
    case SK_Q4_1: dq_strip(SK_Q4_1, w, n0, buf, il, rest); break;
    case SK_Q8_0: dq_strip(SK_Q8_0, w, n0, buf, il, rest); break;
    case SK_Q4_0: dq_strip(SK_Q4_0, w, n0, buf, il, rest); break;
    case SK_Q4_K: dq_strip(SK_Q4_K, w, n0, buf, il, rest); break;
    case SK_Q6_K: dq_strip(SK_Q6_K, w, n0, buf, il, rest); break;
    case SK_Q5_K: dq_strip(SK_Q5_K, w, n0, buf, il, rest); break;
    case SK_F16: dq_strip(SK_F16, w, n0, buf, il, rest); break;
    case SK_BFLOAT16: dq_strip(SK_BFLOAT16, w, n0, buf, il, rest); break;
    default: dq_strip(SK_F32, w, n0, buf, il, rest); break;
    }
}

/* C[c][m] = sum over k of A[c][k] x[m][k] for 16 weight columns c (a strip, bf16, block-interleaved
 * [K/32][16][32]) and the 16 rows m of one packed tile row of x (bt: K/32 tiles of [16 pairs][16
 * rows][2]); r[c] = column c's 16 rows. One x load feeds 16 vdpbf16ps, each with a weight pair
 * broadcast from the strip (L1; constant offsets from one pointer). */
INLINE void dp_tile(const uint16_t *a, const uint32_t *bt, int NB, __m512 r[16]) {
    for (int c = 0; c < 16; c++) r[c] = _mm512_setzero_ps();
    const uint32_t *ak = (const uint32_t *)a;
    for (int kb = 0; kb < NB; kb++, ak += 256, bt += 256) {
#pragma GCC unroll 4
        for (int p = 0; p < 16; p++) {
            const __m512bh xv = (__m512bh)_mm512_loadu_si512(bt + p * 16);
#pragma GCC unroll 16
            for (int c = 0; c < 16; c++)
                r[c] = _mm512_dpbf16_ps(r[c], (__m512bh)_mm512_set1_epi32((int)ak[c * 16 + p]), xv);
        }
    }
}

/* Strips of 16 output columns are split over the threads; each is dequantized once and multiplied
 * with every 16-row tile of x (packed into xb first) by dp_tile. */
static void mm_dpbf16_team(const sk_w *w, int M, const float *x, int ldx, uint32_t *xb, float *y, int ldy, int acc,
                           sk_team *t) {
    const int N = w->n, K = w->k, NB = K / 32, MT = (M + 15) / 16;
    share_begin(t, N / 16);
    pack_x_team(x, ldx, M, K, w->fmt == SK_Q4_1 || w->fmt == SK_Q4_0 || w->fmt == SK_Q4_K, xb, NULL, NULL, t);
    team_barrier(t);
    uint16_t *buf = strip_buffer((size_t)16 * K * 2);
    int s0, s1;
    while (share_next(t, 1, 1, &s0, &s1)) {
        const int n0 = s0 * 16;
        dq_strip_any(w, n0, buf, 1, NULL);
        for (int mt = 0; mt < MT; mt++) {
            __m512 r[16];
            dp_tile(buf, xb + (size_t)mt * NB * 256, NB, r);
            store_tile(r, y + (size_t)mt * 16 * ldy + n0, ldy, M - mt * 16 < 16 ? M - mt * 16 : 16, acc);
        }
    }
}

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

/* Strips of 32 output columns (two tiles) are split over the threads; each strip is dequantized
 * once and multiplied with every 16-row tile of x (packed into xb first). With `two`, both operands
 * go in as two bf16 terms, the value rounded and what that left (w = wh + wl, x = xh + xl, ~16
 * bits each), and three products a block, wh xh + wh xl + wl xh, accumulate in fp32 (wl xl, ~2^-16
 * of the whole, is left out): one bf16 product rounds both operands to 8 bits, and that changed
 * greedy output against the fp32 build on 4 of 20 bench prompts; three keep all 20, for twice the
 * dequantizing (docs/engine.md, *AMX tiles in two terms*). Without `two`, one product (drafts).
 * Tiles: 0, 1 the two column tiles' sums; 4, 5 their wh blocks, 2, 3 their wl blocks; 6 xh, 7 xl.
 * Threads must have loaded the tile configuration (amx_configure). */
static void mm_amx_team(const sk_w *w, int M, const float *x, int ldx, uint32_t *xb, float *y, int ldy, int acc,
                        int two, sk_team *t) {
    const int N = w->n, K = w->k, NB = K / 32, MT = (M + 15) / 16;
    uint32_t *xl = two ? xb + (size_t)MT * NB * 256 : NULL;
    share_begin(t, (N + 31) / 32);
    pack_x_team(x, ldx, M, K, w->fmt == SK_Q4_1 || w->fmt == SK_Q4_0 || w->fmt == SK_Q4_K, xb, xl, NULL, t);
    team_barrier(t);
    uint16_t *buf = strip_buffer((size_t)(two ? 64 : 32) * K * 2); /* wh of both column tiles, then wl */
    uint16_t *wl = two ? buf + (size_t)32 * K : NULL;
    float ctile[2][16 * 16] __attribute__((aligned(64)));
    int s0, s1;
    while (share_next(t, 1, 1, &s0, &s1)) {
        const int n0 = s0 * 32, pair = n0 + 16 < N;
        dq_strip_any(w, n0, buf, 0, wl);
        if (pair) dq_strip_any(w, n0 + 16, buf + (size_t)16 * K, 0, two ? wl + (size_t)16 * K : NULL);
        for (int mt = 0; mt < MT; mt++) {
            const uint32_t *bt = xb + (size_t)mt * NB * 256, *bl = two ? xl + (size_t)mt * NB * 256 : NULL;
            _tile_zero(0);
            _tile_zero(1);
            for (int kb = 0; kb < NB; kb++) {
                _tile_loadd(6, bt + (size_t)kb * 256, 64);
                _tile_loadd(4, buf + kb * 32, K * 2);
                if (two) {
                    _tile_loadd(7, bl + (size_t)kb * 256, 64);
                    _tile_loadd(2, wl + kb * 32, K * 2);
                    _tile_dpbf16ps(0, 2, 6);
                    _tile_dpbf16ps(0, 4, 7);
                }
                _tile_dpbf16ps(0, 4, 6);
                if (pair) {
                    _tile_loadd(5, buf + (size_t)16 * K + kb * 32, K * 2);
                    if (two) {
                        _tile_loadd(3, wl + (size_t)16 * K + kb * 32, K * 2);
                        _tile_dpbf16ps(1, 3, 6);
                        _tile_dpbf16ps(1, 5, 7);
                    }
                    _tile_dpbf16ps(1, 5, 6);
                }
            }
            _tile_stored(0, ctile[0], 64);
            if (pair) _tile_stored(1, ctile[1], 64);
            const int rows = M - mt * 16 < 16 ? M - mt * 16 : 16;
            for (int h = 0; h <= pair; h++) {
                __m512 r[16];
                for (int i = 0; i < 16; i++) r[i] = _mm512_load_ps(ctile[h] + i * 16);
                store_tile(r, y + (size_t)mt * 16 * ldy + n0 + h * 16, ldy, rows, acc);
            }
        }
    }
}
#endif

#endif
