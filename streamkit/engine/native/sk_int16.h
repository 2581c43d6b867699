/* The batched path of the avx2 build (most laptops, many CI runners): activations quantized to int16
 * per block of 32 values (one fp32 scale a block, about the precision of sk_int8.h's two int8 terms),
 * weights as strips of their 4- or 8-bit integers in int16 (sk_int8.h's strip_any; Q8_0 signed, Q4_0
 * as q - 8), products summed in int32 by vpdpwssd where the CPU has AVX-VNNI (Intel client cores
 * since Alder Lake, AMD Zen 5), else vpmaddwd + vpaddd (16 multiply-adds for one multiplier-pipe
 * instruction, against 8 for an fp32 FMA), and scaled per block in fp32 as there:
 *   sum_k value_k * x_k = s0 * dx * sum_k u_k qx_k + s1 * dx * sum_k qx_k,  x_k ~ dx * qx_k.
 * A block's int32 sums stay below 2^31: 32 products of |u| <= 128 and |qx| <= 32767.
 *
 * Layouts: a strip of 16 output columns as int16 [K/32][16 columns][32] (u, from strip_any), its
 * scales s0, s1 read where the weight keeps them (Q4_K's computed into [K/32][16] beside the strip:
 * i16_scales_of); x in tiles of 8 rows, [8-row tile][K/32][16 pairs of k][8 rows][2] int16, so one ymm
 * holds a k pair of 8 rows and a column's pair is one dword broadcast, with dx and dx * sum(qx)
 * [8-row tile][K/32][8]. Included by sk_kernels.c only, where SK_I16 is set. */
#ifndef SK_INT16_H
#define SK_INT16_H

/* one block of one 8-row tile of x; a step's packed x and its scales, MT * NB * (512 + 64) bytes,
 * fit in xb_elems(M, K) * 4 */
#define I16_TILE_BYTES 512

/* x [M][K] fp32 -> int16 tiles, this thread's share of (tile, block) units */
static void i16_pack_x_team(const float *x, int ldx, int M, int K, int16_t *xq, float *dx, float *dxs, sk_team *t) {
    const int NB = K / 32, MT = (M + 7) / 8;
    int j0, j1;
    team_span(t, MT * NB, &j0, &j1); /* whole units: a unit's cache lines interleave its 8 rows */
    for (int j = j0; j < j1; j++) {
        const int mt = j / NB, kb = j % NB;
        uint32_t *tile = (uint32_t *)(xq + (size_t)j * (I16_TILE_BYTES / 2));
        for (int m = 0; m < 8; m++) {
            const int row = mt * 8 + m;
            const size_t si = (size_t)j * 8 + m;
            if (row >= M) { /* padding rows: zeros */
                for (int p = 0; p < 16; p++) tile[p * 8 + m] = 0;
                dx[si] = dxs[si] = 0.0f;
                continue;
            }
            const float *v = x + (size_t)row * ldx + kb * 32;
            const float amax = amax_n(v, 32);
            const float d = amax / 32767.0f;
            const __m256 id = _mm256_set1_ps(amax > 0.0f ? 32767.0f / amax : 0.0f);
            int16_t q[32] __attribute__((aligned(32)));
            __m256i sum = _mm256_setzero_si256();
            for (int i = 0; i < 32; i += 16) {
                const __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + i), id));
                const __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + i + 8), id));
                sum = _mm256_add_epi32(sum, _mm256_add_epi32(a, b));
                /* packs works per 128-bit lane: the permute puts the 16 values back in order */
                _mm256_store_si256((__m256i *)(q + i), _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xD8));
            }
            const uint32_t *pairs = (const uint32_t *)q; /* pair p = values 2p, 2p + 1 */
            for (int p = 0; p < 16; p++) tile[p * 8 + m] = pairs[p];
            dx[si] = d;
            dxs[si] = d * (float)hsum_i32x8(sum);
        }
    }
}

/* Where i16_tile reads a strip's scales: Q4_1, Q4_0 and Q8_0 keep theirs in the weight, so the strip
 * holds only Q4_K's (strip_s0 / strip_s1 [K/32][16]): the strip's scattered scale stores were a
 * quarter of its unpacking. */
static blk_scales i16_scales_of(const sk_w *w, int n0, const float *strip_s0, const float *strip_s1) {
    const blk_scales in_weight = weight_scales(w, n0);
    return in_weight.s0 ? in_weight : (blk_scales){strip_s0, strip_s1, 1, 16};
}

/* f += acc * dx * s0 (+ dx * sum(qx) * s1 where off) for one 8-row half of a column */
INLINE void i16_scale(__m256i acc, __m256 d, __m256 ds, __m256 s0, __m256 s1, float *f, int off) {
    const __m256 prev = _mm256_loadu_ps(f);
    _mm256_storeu_ps(f, _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc), _mm256_mul_ps(d, s0),
                                        off ? _mm256_fmadd_ps(ds, s1, prev) : prev));
}

#if !SK_VNNI256
/* one block of a 4-column pass over two 8-row tiles, vpmaddwd + vpaddd, in assembly: the 8
 * accumulators, the two x rows and the 4 broadcasts are 14 of the 16 ymm registers, a product
 * written over its broadcast once that has used it twice, so no register is moved or spilled. GCC's
 * allocation of the same loop (unrolled 4) moved accumulators between registers every k pair, and
 * these products run at about the rate instructions are dispatched (22 a k pair). AMD EPYC Zen 4,
 * 2 threads, SmolLM2 steps, both builds alternating in one process: 16 rows 1.035-1.045x, 32 rows
 * 1.052x, the same tokens. */
INLINE void i16_block_2x4(const uint32_t *uk, const int16_t *xa, const int16_t *xb, __m256i acc[8][2]) {
    __m256i a00 = acc[0][0], a01 = acc[0][1], a10 = acc[1][0], a11 = acc[1][1];
    __m256i a20 = acc[2][0], a21 = acc[2][1], a30 = acc[3][0], a31 = acc[3][1];
    __m256i x0, x1, b0, b1, b2, b3;
    __asm__(".irp p,0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15\n\t"
            "vmovdqa (\\p*32)(%[xa]), %[x0]\n\t"
            "vmovdqa (\\p*32)(%[xb]), %[x1]\n\t"
            "vpbroadcastd (\\p*4)(%[w]), %[b0]\n\t"
            "vpbroadcastd (64+\\p*4)(%[w]), %[b1]\n\t"
            "vpbroadcastd (128+\\p*4)(%[w]), %[b2]\n\t"
            "vpbroadcastd (192+\\p*4)(%[w]), %[b3]\n\t"
            "vpmaddwd %[x0], %[b0], %%ymm14\n\t"
            "vpmaddwd %[x1], %[b0], %[b0]\n\t"
            "vpaddd %%ymm14, %[a00], %[a00]\n\t"
            "vpaddd %[b0], %[a01], %[a01]\n\t"
            "vpmaddwd %[x0], %[b1], %%ymm15\n\t"
            "vpmaddwd %[x1], %[b1], %[b1]\n\t"
            "vpaddd %%ymm15, %[a10], %[a10]\n\t"
            "vpaddd %[b1], %[a11], %[a11]\n\t"
            "vpmaddwd %[x0], %[b2], %%ymm14\n\t"
            "vpmaddwd %[x1], %[b2], %[b2]\n\t"
            "vpaddd %%ymm14, %[a20], %[a20]\n\t"
            "vpaddd %[b2], %[a21], %[a21]\n\t"
            "vpmaddwd %[x0], %[b3], %%ymm15\n\t"
            "vpmaddwd %[x1], %[b3], %[b3]\n\t"
            "vpaddd %%ymm15, %[a30], %[a30]\n\t"
            "vpaddd %[b3], %[a31], %[a31]\n\t"
            ".endr"
            : [a00] "+x"(a00), [a01] "+x"(a01), [a10] "+x"(a10), [a11] "+x"(a11), [a20] "+x"(a20), [a21] "+x"(a21),
              [a30] "+x"(a30), [a31] "+x"(a31), [x0] "=&x"(x0), [x1] "=&x"(x1), [b0] "=&x"(b0), [b1] "=&x"(b1),
              [b2] "=&x"(b2), [b3] "=&x"(b3)
            : [w] "r"(uk), [xa] "r"(xa), [xb] "r"(xb)
            : "ymm14", "ymm15", "memory");
    acc[0][0] = a00, acc[0][1] = a01, acc[1][0] = a10, acc[1][1] = a11;
    acc[2][0] = a20, acc[2][1] = a21, acc[3][0] = a30, acc[3][1] = a31;
}

/* the same for one block of an 8-column pass over one 8-row tile (steps of 5-8 rows, a step's odd
 * last tile): 8 accumulators, x and 4 broadcasts, each product written over its broadcast. Against
 * GCC's loop (AMD EPYC Zen 4, SmolLM2 steps, both builds alternating in one process, the same
 * tokens): 6 rows 1.35x, 8 rows 1.28-1.31x, 24 rows (a pair of tiles and one) 1.15x. */
INLINE void i16_block_1x8(const uint32_t *uk, const int16_t *xa, __m256i acc[8][2]) {
    __m256i a0 = acc[0][0], a1 = acc[1][0], a2 = acc[2][0], a3 = acc[3][0];
    __m256i a4 = acc[4][0], a5 = acc[5][0], a6 = acc[6][0], a7 = acc[7][0];
    __m256i x0, b0, b1, b2, b3;
    __asm__(".irp p,0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15\n\t"
            "vmovdqa (\\p*32)(%[xa]), %[x0]\n\t"
            "vpbroadcastd (\\p*4)(%[w]), %[b0]\n\t"
            "vpbroadcastd (64+\\p*4)(%[w]), %[b1]\n\t"
            "vpbroadcastd (128+\\p*4)(%[w]), %[b2]\n\t"
            "vpbroadcastd (192+\\p*4)(%[w]), %[b3]\n\t"
            "vpmaddwd %[x0], %[b0], %[b0]\n\t"
            "vpmaddwd %[x0], %[b1], %[b1]\n\t"
            "vpmaddwd %[x0], %[b2], %[b2]\n\t"
            "vpmaddwd %[x0], %[b3], %[b3]\n\t"
            "vpaddd %[b0], %[a0], %[a0]\n\t"
            "vpaddd %[b1], %[a1], %[a1]\n\t"
            "vpaddd %[b2], %[a2], %[a2]\n\t"
            "vpaddd %[b3], %[a3], %[a3]\n\t"
            "vpbroadcastd (256+\\p*4)(%[w]), %[b0]\n\t"
            "vpbroadcastd (320+\\p*4)(%[w]), %[b1]\n\t"
            "vpbroadcastd (384+\\p*4)(%[w]), %[b2]\n\t"
            "vpbroadcastd (448+\\p*4)(%[w]), %[b3]\n\t"
            "vpmaddwd %[x0], %[b0], %[b0]\n\t"
            "vpmaddwd %[x0], %[b1], %[b1]\n\t"
            "vpmaddwd %[x0], %[b2], %[b2]\n\t"
            "vpmaddwd %[x0], %[b3], %[b3]\n\t"
            "vpaddd %[b0], %[a4], %[a4]\n\t"
            "vpaddd %[b1], %[a5], %[a5]\n\t"
            "vpaddd %[b2], %[a6], %[a6]\n\t"
            "vpaddd %[b3], %[a7], %[a7]\n\t"
            ".endr"
            : [a0] "+x"(a0), [a1] "+x"(a1), [a2] "+x"(a2), [a3] "+x"(a3), [a4] "+x"(a4), [a5] "+x"(a5),
              [a6] "+x"(a6), [a7] "+x"(a7), [x0] "=&x"(x0), [b0] "=&x"(b0), [b1] "=&x"(b1), [b2] "=&x"(b2),
              [b3] "=&x"(b3)
            : [w] "r"(uk), [xa] "r"(xa)
            : "memory");
    acc[0][0] = a0, acc[1][0] = a1, acc[2][0] = a2, acc[3][0] = a3;
    acc[4][0] = a4, acc[5][0] = a5, acc[6][0] = a6, acc[7][0] = a7;
}
#endif

/* NC columns (c0..c0+NC-1 of the strip; a constant where inlined, 4 with two tiles, 8 with one) of
 * one or two 8-row tiles (xa, and xb where `two_tiles`), accumulated into out[c * 16 + row] (rows
 * 8..15 from xb). Each accumulator is a chain of dependent multiply-adds: vpdpwssd waits about 4
 * cycles for its accumulator and issues two a cycle, so 4 chains (one tile, 4 columns) can issue
 * only one a cycle (8 columns: the head at 8 rows 2.57 -> 2.46 ms); with 8 the block's scaling (4
 * fp32 operations per 16 multiply-adds, on the same ports) is the limit. With AVX-VNNI a block's 16
 * k pairs are unrolled whole: GCC kept a rolled loop's accumulators on the stack (Intel Xeon, 16
 * rows: 4.0 against 4.25 ms for the head). Without it (vpmaddwd + vpaddd) GCC's loop spilled when
 * unrolled whole and moved registers when unrolled 4, so those passes are in assembly. */
INLINE void i16_tile(const int16_t *u, blk_scales sc, const int16_t *xa, const int16_t *xb, const float *dxa,
                     const float *dxsa, const float *dxb, const float *dxsb, int NB, int c0, int NC, float *out,
                     int two_tiles, int off, sk_pf *pf, size_t pf_per_block) {
    for (int c = 0; c < NC; c++)
        for (int h = 0; h < 2; h++) _mm256_storeu_ps(out + c * 16 + h * 8, _mm256_setzero_ps());
    for (int kb = 0; kb < NB; kb++) {
        if (two_tiles) pf_some(pf, pf_per_block);
        const uint32_t *uk = (const uint32_t *)(u + (size_t)kb * 512) + c0 * 16;
        const int16_t *ka = xa + (size_t)kb * (I16_TILE_BYTES / 2), *kb2 = xb + (size_t)kb * (I16_TILE_BYTES / 2);
        __m256i acc[8][2];
        for (int c = 0; c < NC; c++) acc[c][0] = acc[c][1] = _mm256_setzero_si256();
#if SK_VNNI256
#pragma GCC unroll 16
        for (int p = 0; p < 16; p++) {
            const __m256i x0 = _mm256_load_si256((const __m256i *)(ka + p * 16));
            const __m256i x1 = two_tiles ? _mm256_load_si256((const __m256i *)(kb2 + p * 16)) : x0;
#pragma GCC unroll 8
            for (int c = 0; c < NC; c++) {
                const __m256i wb = _mm256_set1_epi32((int)uk[c * 16 + p]);
                acc[c][0] = _mm256_dpwssd_avx_epi32(acc[c][0], wb, x0);
                if (two_tiles) acc[c][1] = _mm256_dpwssd_avx_epi32(acc[c][1], wb, x1);
            }
        }
#else /* the passes i16_tiles_strip_as makes: two tiles of 4 columns, one of 8 */
        if (two_tiles) i16_block_2x4(uk, ka, kb2, acc);
        else i16_block_1x8(uk, ka, acc);
#endif
        const float *a = sc.s0 + kb * sc.bs + c0 * sc.cs, *o = off ? sc.s1 + kb * sc.bs + c0 * sc.cs : NULL;
        const __m256 d0 = _mm256_loadu_ps(dxa + (size_t)kb * 8), ds0 = _mm256_loadu_ps(dxsa + (size_t)kb * 8);
        const __m256 d1 = _mm256_loadu_ps(dxb + (size_t)kb * 8), ds1 = _mm256_loadu_ps(dxsb + (size_t)kb * 8);
#pragma GCC unroll 8
        for (int c = 0; c < NC; c++) {
            const __m256 ac = _mm256_set1_ps(a[c * sc.cs]), oc = off ? _mm256_set1_ps(o[c * sc.cs]) : ac;
            i16_scale(acc[c][0], d0, ds0, ac, oc, out + c * 16, off);
            if (two_tiles) i16_scale(acc[c][1], d1, ds1, ac, oc, out + c * 16 + 8, off);
        }
    }
}

/* a strip's 16 columns of two 8-row tiles, 4 columns a pass (8 chains), or of one tile, 8 a pass */
INLINE void i16_tiles_strip_as(const int16_t *u, blk_scales sc, const int16_t *xa, const int16_t *xb, const float *dxa,
                               const float *dxsa, const float *dxb, const float *dxsb, int NB, float *ctile,
                               int two_tiles, int off, sk_pf *pf, size_t pf_per_block) {
    if (two_tiles) {
        for (int c0 = 0; c0 < 16; c0 += 4)
            i16_tile(u, sc, xa, xb, dxa, dxsa, dxb, dxsb, NB, c0, 4, ctile + c0 * 16, 1, off, pf, pf_per_block);
    } else {
        for (int c0 = 0; c0 < 16; c0 += 8)
            i16_tile(u, sc, xa, xa, dxa, dxsa, dxa, dxsa, NB, c0, 8, ctile + c0 * 16, 0, off, pf, pf_per_block);
    }
}

/* ... and, with two tiles, pf_per_block lines of pf (the next strip's weights) prefetched each block of
 * each pass */
static void i16_tiles_strip(const int16_t *u, blk_scales sc, const int16_t *xa, const int16_t *xb, const float *dxa,
                            const float *dxsa, const float *dxb, const float *dxsb, int NB, float *ctile,
                            int two_tiles, sk_pf *pf, size_t pf_per_block) {
    if (sc.s1) i16_tiles_strip_as(u, sc, xa, xb, dxa, dxsa, dxb, dxsb, NB, ctile, two_tiles, 1, pf, pf_per_block);
    else i16_tiles_strip_as(u, sc, xa, xb, dxa, dxsa, dxb, dxsb, NB, ctile, two_tiles, 0, pf, pf_per_block);
}

/* the 16 x 16 tile ct ([column][row]) into y's rows (+= where acc) */
INLINE void i16_store_tile(const float *ct, float *y, int ldy, int rows, int acc) {
    for (int m = 0; m < rows; m++) {
        float *o = y + (size_t)m * ldy;
        for (int c = 0; c < 16; c++) o[c] = acc ? o[c] + ct[c * 16 + m] : ct[c * 16 + m];
    }
}

/* y [M][ldy] (+)= x . W^T on the int16 path; xbuf: xb_elems(M, K) * 4 bytes shared by the team */
static void mm_i16_team(const sk_w *w, int M, const float *x, int ldx, void *xbuf, float *y, int ldy, int acc,
                        sk_team *t) {
    const int N = w->n, K = w->k, NB = K / 32, MT = (M + 7) / 8;
    int16_t *xq = xbuf;
    float *dx = (float *)((uint8_t *)xbuf + (size_t)MT * NB * I16_TILE_BYTES), *dxs = dx + (size_t)MT * NB * 8;
    share_begin(t, N / 16);
    i16_pack_x_team(x, ldx, M, K, xq, dx, dxs, t);
    team_barrier(t);
    uint8_t *u = strip_buffer((size_t)16 * K * 2 + 2 * (size_t)16 * NB * 4);
    float *s0 = (float *)(u + (size_t)16 * K * 2), *s1 = s0 + (size_t)16 * NB;
    float ctile[16 * 16] __attribute__((aligned(64)));
    const size_t tb = (size_t)NB * (I16_TILE_BYTES / 2); /* int16 per 8-row tile */
    int a0, a1;
    while (share_next(t, 1, 1, &a0, &a1)) {
        const int n0 = a0 * 16;
        /* the next strip's rows (this thread's, unless another takes it): with one tile while this
         * strip is unpacked, with two a few lines each block of the first pair's passes (16-row
         * steps 1.05x; with one tile that ran 4-8 % slower than prefetching while unpacking) */
        strip_any(w, n0, (int16_t *)u, s0, s1, MT == 1);
        const blk_scales sc = i16_scales_of(w, n0, s0, s1);
        sk_pf pf = pf_rows(w, n0 + 16, MT == 1 ? 0 : 16);
        const size_t per = pf_spread(&pf, 4 * (size_t)NB);
        for (int mt = 0; mt < MT; mt += 2) {
            const int two_tiles = mt + 1 < MT, rows = M - mt * 8 < 16 ? M - mt * 8 : 16;
            const float *da = dx + (size_t)mt * NB * 8, *dsa = dxs + (size_t)mt * NB * 8;
            i16_tiles_strip((const int16_t *)u, sc, xq + mt * tb, xq + (mt + two_tiles) * tb, da, dsa,
                            da + (size_t)two_tiles * NB * 8, dsa + (size_t)two_tiles * NB * 8, NB, ctile, two_tiles,
                            &pf, per);
            i16_store_tile(ctile, y + (size_t)mt * 8 * ldy + n0, ldy, rows, acc);
        }
    }
}

#endif
