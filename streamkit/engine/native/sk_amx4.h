/* 4-bit weights (Q4_0, Q4_1, Q4_K) on AMX tiles as their integers, scaled per block after the tile
 * products. A 4-bit value is s0 * t + s1 with t = q (Q4_0: q - 8) exact in one bf16, so
 *   sum_k w_k x_k = sum_blocks (s0 * sum_k t_k (xh_k + xl_k) + s1 * sum_k x_k),
 * x in two bf16 terms (sk_bf16.h's xh + xl, ~16 bits). Each block takes two tile products (t xh,
 * t xl) into a zeroed tile, stored and scaled by s0 into 16 zmm sums (fp32 FMAs on the vector ports,
 * beside the tile unit); the offsets' part is itself a product over the blocks, on tiles as well
 * (amx4_offsets). mm_amx_team's two terms instead round the dequantized weights to wh + wl (three
 * products a block), and that dequantizing (a 16-entry fp32 table a block rounded twice and picked
 * from) was half of a 16-row prefill step of the 1.5B (docs/engine.md, *Where a prefill step's
 * time goes on AMX*); here the strip's values come from one constant table, and the weights are
 * exact. Matmuls against that path (Intel Xeon, 2 threads): the 1.5B's Q4_K gate at 9-32 rows
 * 1.29-1.38x, its down projection at 16 rows 1.44x, SmolLM2's Q4_1 1.14-1.17x; at 128 rows 1.07x
 * (the scaling grows with the rows, the dequantizing did not).
 *
 * Layouts: the strip is bf16 [16 columns][K] in Q4_ORDER (the A operand, as mm_amx_team's), Q4_K's
 * scales [16][K/32] and the offsets' two terms [16][padded_blocks] beside it (Q4_1's and Q4_0's
 * scales are read where the weight keeps them); x as pack_x_team's xh and xl tiles and its sums
 * (pack_sum). Included by sk_kernels.c only, after sk_bf16.h, where SK_AMX is set. */
#ifndef SK_AMX4_H
#define SK_AMX4_H

INLINE int amx4_format(int fmt) { return fmt == SK_Q4_1 || fmt == SK_Q4_0 || fmt == SK_Q4_K; }

/* bytes of one strip: its integers, Q4_K's scales and the offsets' two bf16 terms */
INLINE size_t amx4_strip_bytes(int K) {
    const int NB = K / 32;
    return (size_t)16 * K * 2 + (size_t)16 * NB * 4 + 2 * (size_t)16 * padded_blocks(NB) * 2;
}

/* 16 columns from n0 -> the bf16 integers t in Q4_ORDER (dq_strip_q4 with ints)
 * at buf; for Q4_K the blocks' scales into s0 [16][K/32]; each block's offset as two bf16 terms into
 * oh / ol [16][padded_blocks] (zeros past K; none for Q4_0) */
static blk_scales amx4_strip(const sk_w *wp, int n0, uint16_t *buf, float *s0, uint16_t *oh, uint16_t *ol) {
    const sk_w lw = *wp, *w = &lw; /* a local copy: the stores below cannot alias it */
    const int K = w->k, NB = K / 32, NBp = padded_blocks(NB);
    dq_strip_q4(w->fmt, w, n0, buf, K, 32, NULL, 1, 0); /* mm_amx4_team prefetches the next strip */
    for (int c = 0; c < 16 && w->fmt != SK_Q4_0; c++) {
        const size_t ba = (size_t)(n0 + c) * NB;
        uint16_t *h = oh + (size_t)c * NBp, *l = ol + (size_t)c * NBp;
        if (w->fmt == SK_Q4_K) {
            for (int kb = 0; kb < NB; kb += 8) { /* K % 256 == 0: whole super-blocks of 8 blocks */
                const __m512 v = q4k_scales8_v(w->sc, ba + kb); /* 8 scales, then 8 offsets */
                _mm256_storeu_ps(s0 + (size_t)c * NB + kb, _mm512_castps512_ps256(v));
                bf16_split8_high(v, h + kb, l + kb);
            }
            for (int kb = NB; kb < NBp; kb += 8) bf16_split8_high(_mm512_setzero_ps(), h + kb, l + kb);
        } else /* Q4_1: (d, m) pairs, the m of 16 blocks at a time (zeros past K) */
            for (int kb = 0; kb < NBp; kb += 16) {
                const int n = kb < NB ? 2 * (NB - kb < 16 ? NB - kb : 16) : 0;
                const float *p = w->sc + (ba + kb) * 2;
                const __m512 a = _mm512_maskz_loadu_ps((__mmask16)((1u << (n < 16 ? n : 16)) - 1), p);
                const __m512 b = _mm512_maskz_loadu_ps((__mmask16)(n > 16 ? (1u << (n - 16)) - 1 : 0), p + 16);
                const __m512i odd = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
                bf16_split16(_mm512_permutex2var_ps(a, odd, b), h + kb, l + kb);
            }
    }
    return w->fmt == SK_Q4_K ? (blk_scales){s0, NULL, NB, 1} : weight_scales(wp, n0); /* offsets: amx4_offsets */
}

/* r[c] += s0 * (the stored block products of column c) */
INLINE void amx4_scale(__m512 r[16], const float *prod, blk_scales sc, int kb) {
    const float *a = sc.s0 + kb * sc.bs;
#pragma GCC unroll 16
    for (int c = 0; c < 16; c++)
        r[c] = _mm512_fmadd_ps(_mm512_load_ps(prod + c * 16), _mm512_set1_ps(a[c * sc.cs]), r[c]);
}

/* out[c * 16 + m] += sum over blocks of column c's offset times row m's sum of x over the block:
 * a matrix product over the blocks of K, on tiles (the offsets' two terms against the sums' three,
 * five products; two terms of the sums doubled the error on Q4_1): as fp32 FMAs beside each
 * block's scaling it cost 15-20 % of a 16-row matmul */
static void amx4_offsets(const uint16_t *oh, const uint16_t *ol, int NBp, const uint16_t *sums, float *out) {
    float prod[16 * 16] __attribute__((aligned(64)));
    _tile_zero(0);
    for (int kc = 0; kc < NBp / 32; kc++) {
        _tile_loadd(2, oh + kc * 32, NBp * 2);
        _tile_loadd(3, ol + kc * 32, NBp * 2);
        _tile_loadd(4, sums + (size_t)kc * 1536, 64);
        _tile_loadd(5, sums + (size_t)kc * 1536 + 512, 64);
        _tile_loadd(6, sums + (size_t)kc * 1536 + 1024, 64);
        _tile_dpbf16ps(0, 2, 4);
        _tile_dpbf16ps(0, 2, 5);
        _tile_dpbf16ps(0, 2, 6);
        _tile_dpbf16ps(0, 3, 4);
        _tile_dpbf16ps(0, 3, 5);
    }
    _tile_stored(0, prod, 64);
    for (int c = 0; c < 16; c++)
        _mm512_store_ps(out + c * 16, _mm512_add_ps(_mm512_load_ps(out + c * 16), _mm512_load_ps(prod + c * 16)));
}

/* One block's two products into tile C, stored to prod. Tile numbers are immediates, so the two
 * sets the loop alternates between (a block's products run while the one before is scaled) are two
 * expansions of this macro: sums 0 / 1, weights 2 / 3, xh 4 / 5, xl 6 / 7. */
#define AMX4_BLOCK(C, W, XH, XL, kb, prod)                                                                            \
    do {                                                                                                           \
        pf_some(pf, pf_per_block);                                                                                 \
        _tile_loadd(W, u + (size_t)(kb) * 32, K * 2);                                                              \
        _tile_loadd(XH, xh + (size_t)(kb) * 256, 64);                                                              \
        _tile_loadd(XL, xl + (size_t)(kb) * 256, 64);                                                              \
        _tile_zero(C);                                                                                             \
        _tile_dpbf16ps(C, W, XH);                                                                                  \
        _tile_dpbf16ps(C, W, XL);                                                                                  \
        _tile_stored(C, prod, 64);                                                                                 \
    } while (0)

/* the strip's 16 columns times one 16-row tile of x: out[c * 16 + m] = column c's row m. The sums
 * stay in registers in between: a pointer from the caller kept them on the stack, reloaded around
 * every tile instruction. */
static void amx4_tile(const uint16_t *u, int K, const uint32_t *xh, const uint32_t *xl, blk_scales sc, float *out,
                      sk_pf *pf, size_t pf_per_block) {
    const int NB = K / 32;
    float prod[2][16 * 16] __attribute__((aligned(64)));
    __m512 r[16];
#pragma GCC unroll 16
    for (int c = 0; c < 16; c++) r[c] = _mm512_setzero_ps();
    AMX4_BLOCK(0, 2, 4, 6, 0, prod[0]);
    for (int kb = 0; kb < NB; kb += 2) {
        if (kb + 1 < NB) AMX4_BLOCK(1, 3, 5, 7, kb + 1, prod[1]);
        amx4_scale(r, prod[0], sc, kb);
        if (kb + 1 < NB) {
            if (kb + 2 < NB) AMX4_BLOCK(0, 2, 4, 6, kb + 2, prod[0]);
            amx4_scale(r, prod[1], sc, kb + 1);
        }
    }
#pragma GCC unroll 16
    for (int c = 0; c < 16; c++) _mm512_store_ps(out + c * 16, r[c]);
}

/* y [M][ldy] (+)= x . W^T for a 4-bit W (amx4_format): strips of 16 columns split over the threads,
 * each made once and multiplied with every 16-row tile of x. xb: xb_elems(M, K) words (xh, xl, then
 * the sums of x, see pack_sum). Threads must have loaded the tile configuration (amx_configure).
 * Taking 4 strips at a time, K in chunks of 8 blocks over them (x's tiles kept in L1), measured
 * 0.97-1.02x at 16 rows (1.10x on SmolLM2's K = 576) and was not kept. */
static void mm_amx4_team(const sk_w *w, int M, const float *x, int ldx, uint32_t *xb, float *y, int ldy, int acc,
                         sk_team *t) {
    const int N = w->n, K = w->k, NB = K / 32, NBp = padded_blocks(NB), MT = (M + 15) / 16;
    uint32_t *xl = xb + (size_t)MT * NB * 256;
    uint16_t *sums = (uint16_t *)(xl + (size_t)MT * NB * 256);
    share_begin(t, N / 16);
    pack_x_team(x, ldx, M, K, 1, xb, xl, sums, t);
    team_barrier(t);
    uint16_t *u = strip_buffer(amx4_strip_bytes(K));
    float *s0 = (float *)(u + (size_t)16 * K);
    uint16_t *oh = (uint16_t *)(s0 + (size_t)16 * NB), *ol = oh + (size_t)16 * NBp;
    float out[16 * 16] __attribute__((aligned(64)));
    int a0, a1;
    while (share_next(t, 1, 1, &a0, &a1)) {
        const int n0 = a0 * 16;
        const blk_scales sc = amx4_strip(w, n0, u, s0, oh, ol);
        __asm__ volatile("" ::: "memory"); /* the tile loads (asm without a memory operand) read the strip */
        sk_pf pf = pf_rows(w, n0 + 16, 16); /* the next strip's weights, spread over this one's blocks */
        const size_t per = pf_spread(&pf, (size_t)MT * NB);
        for (int mt = 0; mt < MT; mt++) {
            const size_t at = (size_t)mt * NB;
            amx4_tile(u, K, xb + at * 256, xl + at * 256, sc, out, &pf, per);
            if (w->fmt != SK_Q4_0) amx4_offsets(oh, ol, NBp, sums + (size_t)mt * NBp * 48, out);
            __m512 r[16];
            for (int c = 0; c < 16; c++) r[c] = _mm512_load_ps(out + c * 16);
            store_tile(r, y + (size_t)mt * 16 * ldy + n0, ldy, M - mt * 16 < 16 ? M - mt * 16 : 16, acc);
        }
    }
}

#endif
