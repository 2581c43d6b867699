/* streamkit native CPU decode path.
 *
 * Matmuls read the GGUF's quantized blocks as the file stores them (Q4_1, Q4_0, Q8_0; repacked
 * Q4_K / Q6_K; F32 for anything else) and dequantize them in registers (sk_dequant.h):
 *   - fp32 path (FMA, sk_fma.h): w = d*q + m in fp32, exactly gguf's dequantize, then fp32 dot
 *     products. Steps with few rows, where reading the weights is the cost, read them straight;
 *     batched steps dequantize a 16-column strip to fp32 once and run every row over it.
 *   - bf16 paths (sk_bf16.h, AVX-512 with AVX512_BF16): a strip of weights is dequantized to bf16
 *     once per step and multiplied with every row of the step on AMX tiles, or with vdpbf16ps
 *     where there is no AMX. Used for batched steps, where the fp32 FMAs would be the cost.
 * sk_forward runs a whole Llama step (every layer, attention over the paged KV cache, final norm and
 * LM head) in one call, so a decode step costs one Python call instead of ~750 torch ops.
 *
 * Built at run time by streamkit/engine/native/__init__.py, once per instruction-set variant
 * (amx, avx512, avx2) with explicit -m flags: AVX-512F + F16C, or AVX2 + FMA + F16C without any
 * AVX-512 (sk_vec.h gives both the same 16-float vectors). AMX is used when the compiler targets
 * it and the kernel grants the tile state (arch_prctl).
 */
#define _GNU_SOURCE
#include <cpuid.h>
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#if !defined(__F16C__) || !(defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__)))
#error "the streamkit native kernels need F16C and AVX-512F, or F16C, AVX2 and FMA"
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512BF16__)
#define SK_BF16 1
#else
#define SK_BF16 0
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define SK_HAS_VNNI 1 /* the instructions (sk_gemv.h uses them) */
#else
#define SK_HAS_VNNI 0
#endif
#if SK_BF16 && defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define SK_AMX 1
#else
#define SK_AMX 0
#endif
/* AVX-VNNI: vpdpbusd on ymm in a build without AVX-512 (the avx2 path) */
#if defined(__AVXVNNI__) && !defined(__AVX512F__)
#define SK_VNNI256 1
#else
#define SK_VNNI256 0
#endif
/* the batched int8 path (sk_int8.h), where no AMX tiles take the batched steps */
#define SK_VNNI (SK_HAS_VNNI && !SK_AMX)
/* the avx2 build: batched steps on int16 activations (sk_int16.h; vpdpwssd where the CPU has AVX-VNNI) */
#ifndef __AVX512F__
#define SK_I16 1
#else
#define SK_I16 0
#endif
/* rows a tile of the batched kernel holds: int8's 16, int16's 8 */
#if SK_I16
#define SK_BATCH_TILE 8
#else
#define SK_BATCH_TILE 16
#endif

#include "sk_pool.h"
#include "sk_vec.h"
#include "sk_dequant.h"
#include "sk_repack.h"
#include "sk_fma.h"
#include "sk_gemv.h"
#include "sk_greedy.h"
#include "sk_head4.h"
#include "sk_sample.h"
#if SK_BF16
#include "sk_bf16.h"
#endif
#if SK_AMX
#include "sk_amx4.h"
#endif
#if SK_VNNI || SK_I16
#include "sk_int8.h"
#endif
#if SK_I16
#include "sk_int16.h"
#endif

#define SK_API __attribute__((visibility("default")))

static int g_amx = 0; /* AMX compiled in, present and granted by the kernel */

/* From this many rows the fp32 path dequantizes each 16-column strip once (mm_strip_team) instead
 * of once per 4 rows (bit-identical results, see there). */
#define SK_STRIP_MIN_ROWS 8

/* the batched paths' packed-activation buffer, for `rows` rows of at most `k` inputs: per 16 rows
 * and block of 32, the AMX paths' two bf16 tiles (x and what its rounding left) and the rows' sums
 * of x in three bf16 terms, blocks padded to a multiple of 32 (sk_bf16.h pack_sum); or the int8
 * path's two terms and their scales */
static size_t xb_elems(int rows, int k) {
    return (size_t)((rows + 15) / 16) * ((size_t)(k / 32) * 512 + (size_t)(k / 32 + 31) / 32 * 32 * 24);
}

static int use_bf16(const sk_w *w, int M, int bf16_min_rows) {
    return SK_BF16 && bf16_min_rows > 0 && M >= bf16_min_rows && w->n % 16 == 0;
}

/* the int8 path of few rows (sk_gemv.h) */
static int use_gemv(const sk_w *w, int M, int gemv) {
    /* on AMX as well: the 1.5B's Q4_K gate matrix at 5 / 8 rows, Intel Xeon, 2 threads: 709 / 1022
     * us against 1594 / 1522 on AMX tiles (two terms an operand) and 1504 / 2002 in fp32 */
    return gemv && gemv_takes(w, M);
}

/* The rows of a batched int8 / int16 step past its last whole tile (16 rows, the int16 kernel's 8)
 * that the few-row kernel takes instead: the tiles hold rows in vector lanes, so 17 rows cost two
 * whole tiles (the 1.5B: 180 ms against 116 for 16; the 0.5B draft 57 against 38), while the
 * few-row kernel costs one more pass over the weights and its int8 work per row. 0: none. */
static int gemv_tail(const sk_w *w, int M, int gemv) {
    const int tail = M % SK_BATCH_TILE;
    return gemv && M > SK_BATCH_TILE && tail && tail <= SK_GEMV_GROUP && gemv_takes(w, tail) ? tail : 0;
}

static int use_i8(const sk_w *w, int M, int i8_min_rows) {
#if SK_VNNI || SK_I16
    return i8_min_rows > 0 && M >= i8_min_rows && w->n % 16 == 0 && i8_format(w->fmt);
#else
    (void)w; (void)M; (void)i8_min_rows;
    return 0;
#endif
}

/* y [M][ldy] (+)= x [M][ldx] . W^T by every thread of the team, then a barrier; xb: xb_elems(M, w->k).
 * Steps of at least i8_min_rows rows take the int8 path where the weight's format has one, else
 * from bf16_min_rows the bf16 path (0: never; both 0: all fp32, exact); with gemv, steps of few rows
 * take the int8 path of few rows where sk_gemv.h's gemv_takes says so, and so do the last rows of
 * an int8 step past its whole tiles (gemv_tail). */
static void matmul_team(const sk_w *w, int M, const float *x, int ldx, float *y, int ldy, int acc, int bf16_min_rows,
                        int i8_min_rows, int i8_two, int gemv, uint32_t *xb, sk_team *t) {
    if (use_gemv(w, M, gemv)) mm_gemv_team(w, M, x, ldx, (uint8_t *)xb, y, ldy, acc, i8_two, t);
    else
#if SK_VNNI || SK_I16
    if (use_i8(w, M, i8_min_rows)) {
        const int tail = gemv_tail(w, M, gemv);
#if SK_VNNI
        mm_i8_team(w, M - tail, x, ldx, xb, y, ldy, acc, i8_two, t);
#else
        mm_i16_team(w, M - tail, x, ldx, xb, y, ldy, acc, t);
#endif
        if (tail) {
            team_barrier(t); /* xb is the tail's now */
            mm_gemv_team(w, tail, x + (size_t)(M - tail) * ldx, ldx, (uint8_t *)xb, y + (size_t)(M - tail) * ldy, ldy,
                         acc, i8_two, t);
        }
    } else
#endif
#if SK_BF16
    if (use_bf16(w, M, bf16_min_rows)) {
#if SK_AMX
        if (g_amx && i8_two && amx4_format(w->fmt)) mm_amx4_team(w, M, x, ldx, xb, y, ldy, acc, t);
        else if (g_amx) mm_amx_team(w, M, x, ldx, xb, y, ldy, acc, i8_two, t);
        else
#endif
            mm_dpbf16_team(w, M, x, ldx, xb, y, ldy, acc, t);
    } else
#endif
    if (M >= SK_STRIP_MIN_ROWS)
        mm_strip_team(w, M, x, ldx, y, ldy, acc, t);
    else
        mm_fma_team(w, M, x, ldx, y, ldy, acc, t);
    (void)xb;
    (void)bf16_min_rows;
    (void)i8_min_rows;
    (void)i8_two;
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

/* out[c0..c1) of x's RMS norm (over all D) times w (c0, c1 multiples of 16) */
static void rms_norm_cols(const float *x, const float *w, int D, float eps, float *out, int c0, int c1) {
    v16 ss = v16_zero();
    for (int i = 0; i < D; i += 16) {
        const v16 v = v16_load(x + i);
        ss = v16_fmadd(v, v, ss);
    }
    const v16 r = v16_set1(1.0f / sqrtf(v16_hsum(ss) / (float)D + eps));
    for (int i = c0; i < c1; i += 16) v16_store(out + i, v16_mul(v16_mul(v16_load(x + i), r), v16_load(w + i)));
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

/* a fused matrix (QKV, gate+up) as runs of rows in one format each, stacked: the output columns of
 * part i follow those of part i - 1. One part unless the file stores its pieces in different
 * formats (a Q4_K_M file's Q4_K q/k and Q6_K v), which are kept as stored rather than re-quantized. */
#define SK_MAX_PARTS 3
typedef struct {
    sk_w w[SK_MAX_PARTS];
    int n_parts, rows; /* rows: what the parts must add up to */
} sk_parts;

typedef struct {
    const float *attn_norm, *ffn_norm;
    sk_parts qkv, gu;
    sk_w o, down;
    const float *qkv_bias; /* NULL, or [(n_heads + 2 n_kv) head_dim] added after the QKV matmul (qwen2) */
} sk_layer;

#define SK_MAX_HEAD_DIM 256

/* what the K/V pools hold: float32, float16, or int8 with a float32 scale a slot's K column / V row */
enum { SK_KV_F32, SK_KV_F16, SK_KV_I8 };

typedef struct {
    int n_layers, dim, ffn, n_heads, n_kv, head_dim, vocab;
    float eps, scale;
    sk_w embed, head;
    const float *out_norm, *rope_cos, *rope_sin; /* rope tables [rope_len][head_dim / 2] */
    int rope_len;
    sk_layer *layers;
    /* [n_layers][n_kv][pool_slots][head_dim] in kv_kind's type; each block of K is stored transposed,
     * [head_dim][block_size], so the scores of 16 positions come out of head_dim FMAs with no
     * horizontal sums. SK_KV_I8: each slot's K column and V row as int8 with one float32 scale,
     * k_scale / v_scale [n_layers][n_kv][pool_slots] (kv_quantize) */
    void *k_pool, *v_pool;
    float *k_scale, *v_scale;
    long pool_slots;
    int block_size, kv_kind;
    /* scratch, grown on demand */
    float *x, *h, *qkv, *att, *gu, *act, *lx;
    uint32_t *xb;
    int cap_t, cap_r;
    gh_prep gh; /* the greedy head's per-block sums of the head's weights, made at its first use (gh_tried) */
    int gh_tried;
    h4_head h4; /* the few-row greedy steps' 4-bit copy of the head (sk_head4.h), made at its first use */
    int h4_tried;
} sk_model;

/* bit 0: loaded; 1: AMX tiles granted; 2: the bf16 paths compiled in (AVX512_BF16); 3: AVX-512
 * (not the AVX2 build); 4: the int8 path compiled in (AVX512_VNNI); 5: the int16 path (the AVX2
 * build); 6: AVX-VNNI compiled in (the AVX2 build's vpdpbusd / vpdpwssd); 7: the greedy head
 * (sk_greedy.h: vpdpbusd on ymm, from AVX-VNNI or AVX512_VNNI) */
SK_API int sk_init(void) {
    int caps = 1 | (SK_BF16 << 2) | (SK_VNNI << 4) | (SK_I16 << 5) | (SK_VNNI256 << 6) | (SK_GREEDY << 7);
#ifdef __AVX512F__
    caps |= 8;
#endif
#if SK_AMX
    unsigned a, b, c, d;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d) && (d & (1u << 22)) && (d & (1u << 24))) {
        /* ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA: Linux hands out the tile state on request */
        if (syscall(SYS_arch_prctl, 0x1023, 18) == 0) g_amx = 1;
    }
#endif
    if (g_amx) caps |= 2;
    unsigned v0, vendor[3];
    if (__get_cpuid(0, &v0, &vendor[0], &vendor[2], &vendor[1])) /* ebx, edx, ecx: "AuthenticAMD" */
        g_gemv_chunks = memcmp(vendor, "AuthenticAMD", 12) == 0;
    return caps;
}

/* whether few-row K-quant matmuls take passes over chunks of K (sk_gemv.h's gemv_chunk; sk_init sets
 * it by the CPU's vendor): on >= 0 sets it (tests force the passes on CPUs that skip them); returns it */
SK_API int sk_gemv_chunks(int on) {
    if (on >= 0) g_gemv_chunks = on != 0;
    return g_gemv_chunks;
}

/* whether a step's few-row matmuls of small x have each thread pack x for itself (sk_gemv.h's
 * mm_gemv_own_team; the default): on >= 0 sets it (tests run both ways); returns it */
SK_API int sk_gemv_own_x(int on) {
    if (on >= 0) g_gemv_own_x = on != 0;
    return g_gemv_own_x;
}

/* teams up to n threads meet at the flag barrier, larger ones at the centralized one (sk_pool.h):
 * n in [0, SK_FLAG_BARRIER_MAX] sets it (tests run both); returns it */
SK_API int sk_flag_barrier_max(int n) {
    if (n >= 0 && n <= SK_FLAG_BARRIER_MAX) g_flag_barrier_max = n;
    return g_flag_barrier_max;
}

SK_API sk_model *sk_model_new(int n_layers, int dim, int ffn, int n_heads, int n_kv, int head_dim, int vocab,
                              float eps, float scale) {
    if (dim % 32 || ffn % 32 || head_dim % 16 || head_dim > SK_MAX_HEAD_DIM || n_kv <= 0 || n_heads % n_kv ||
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
    gh_free(&m->gh);
    h4_free(&m->h4);
    free(m->layers);
    free(m);
}

/* every weight is passed as (format, qs, sc): see sk_w */
SK_API void sk_model_set_globals(sk_model *m, int embed_fmt, const uint8_t *embed_qs, const float *embed_sc, int head_fmt,
                                 const uint8_t *head_qs, const float *head_sc, const float *out_norm,
                                 const float *rope_cos, const float *rope_sin, int rope_len) {
    m->embed = (sk_w){embed_fmt, m->vocab, m->dim, embed_qs, embed_sc};
    m->head = (sk_w){head_fmt, m->vocab, m->dim, head_qs, head_sc};
    gh_free(&m->gh);
    m->gh_tried = 0;
    h4_free(&m->h4);
    m->h4_tried = 0;
    m->out_norm = out_norm; m->rope_cos = rope_cos; m->rope_sin = rope_sin; m->rope_len = rope_len;
}

/* a layer's norms and single matrices; its fused QKV and gate+up come part by part (sk_model_add_part) */
SK_API void sk_model_set_layer(sk_model *m, int i, const float *attn_norm, const float *ffn_norm, int o_fmt,
                               const uint8_t *o_qs, const float *o_sc, int down_fmt, const uint8_t *down_qs,
                               const float *down_sc) {
    const int hd = m->head_dim;
    sk_layer *L = &m->layers[i];
    L->attn_norm = attn_norm; L->ffn_norm = ffn_norm;
    L->qkv = (sk_parts){.rows = (m->n_heads + 2 * m->n_kv) * hd};
    L->gu = (sk_parts){.rows = 2 * m->ffn};
    L->o = (sk_w){o_fmt, m->dim, m->n_heads * hd, o_qs, o_sc};
    L->down = (sk_w){down_fmt, m->dim, m->ffn, down_qs, down_sc};
}

static int parts_rows(const sk_parts *p) {
    int rows = 0;
    for (int j = 0; j < p->n_parts; j++) rows += p->w[j].n;
    return rows;
}

/* The next n rows of layer i's fused QKV (which 0: q rows, then k, then v) or gate+up (which 1: gate
 * rows, then up). Returns -1 for a fourth part, rows past the matrix's or n not a multiple of 16. */
SK_API int sk_model_add_part(sk_model *m, int i, int which, int fmt, int n, const uint8_t *qs, const float *sc) {
    sk_parts *p = which ? &m->layers[i].gu : &m->layers[i].qkv;
    if (p->n_parts == SK_MAX_PARTS || n <= 0 || n % 16 || parts_rows(p) + n > p->rows) return -1;
    p->w[p->n_parts++] = (sk_w){fmt, n, m->dim, qs, sc};
    return 0;
}

SK_API void sk_model_set_qkv_bias(sk_model *m, int i, const float *bias) { m->layers[i].qkv_bias = bias; }

/* kv_bytes: 4 (float32), 2 (float16) or 1 (int8, with the scale pools k_scale and v_scale) an element;
 * -1 for a block size that is not a multiple of 16, -2 for another element size or int8 without scales */
SK_API int sk_model_set_kv(sk_model *m, void *k_pool, void *v_pool, long pool_slots, int block_size, int kv_bytes,
                           float *k_scale, float *v_scale) {
    if (block_size % 16) return -1;
    if ((kv_bytes != 1 && kv_bytes != 2 && kv_bytes != 4) || (kv_bytes == 1 && !(k_scale && v_scale))) return -2;
    m->k_pool = k_pool; m->v_pool = v_pool; m->pool_slots = pool_slots; m->block_size = block_size;
    m->kv_kind = kv_bytes == 4 ? SK_KV_F32 : kv_bytes == 2 ? SK_KV_F16 : SK_KV_I8;
    m->k_scale = kv_bytes == 1 ? k_scale : NULL;
    m->v_scale = kv_bytes == 1 ? v_scale : NULL;
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

/* 16 K or V values from element i of a pool of kind (SK_KV_I8: before their slots' scales) as float32 */
INLINE v16 kv_load(const void *p, size_t i, int kind) {
    return kind == SK_KV_F16 ? v16_load_half((const uint16_t *)p + i)
           : kind == SK_KV_I8 ? v16_load_i8((const int8_t *)p + i)
                              : v16_load((const float *)p + i);
}

INLINE size_t kv_esize(int kind) { return kind == SK_KV_F32 ? 4 : kind == SK_KV_F16 ? 2 : 1; }

/* The rotation of int8 K and V before they are rounded: the unnormalized Walsh-Hadamard transform of
 * each chunk of head_dim (its largest power-of-two divisor) spreads the few channels where K is large
 * over the chunk, so one scale a position no longer leaves the others a handful of levels (greedy
 * equal to the fp32 cache's on 5 of 10 prompts without it, 9 with it: docs/engine.md). Orthogonal up
 * to the chunk's size: the query rotated the same way gives chunk times the same dot product, and the
 * weighted sum of rotated V rotated again is chunk times the sum of V. */
INLINE int kv_rot_chunk(int hd) { return hd & -hd; }

INLINE void kv_rotate(float *x, int hd) {
    const int n = kv_rot_chunk(hd); /* >= 16: head_dim is a multiple of 16 */
    for (int i = 0; i < hd; i += 16) v16_store(x + i, v16_fwht16(v16_load(x + i)));
    for (int c = 0; c < hd; c += n)
        for (int h = 16; h < n; h <<= 1)
            for (int i = c; i < c + n; i += 2 * h)
                for (int j = i; j < i + h; j += 16) {
                    const v16 a = v16_load(x + j), b = v16_load(x + j + h);
                    v16_store(x + j, v16_add(a, b));
                    v16_store(x + j + h, v16_sub(a, b));
                }
}

/* heads a pass of the score loop (two accumulators each) and v16 accumulators a pass of the
 * weighted sum of V: within AVX-512's 32 registers, or AVX2's 16 (a v16 is two ymm there) */
#ifdef __AVX512F__
#define SK_SG 4
#define SK_VACC 16
#else
#define SK_SG 3
#define SK_VACC 6
#endif

/* the K and V of one KV block (block_base: its first element) into L1, ahead of its use, with their
 * scales' lines where kind has them */
INLINE void prefetch_kv_block(const sk_model *m, size_t block_base, int kind) {
    const size_t es = kv_esize(kind), at = block_base * es, bytes = (size_t)m->block_size * m->head_dim * es;
    for (size_t i = 0; i < bytes; i += 64) {
        prefetch((const char *)m->k_pool + at + i);
        prefetch((const char *)m->v_pool + at + i);
    }
    if (kind == SK_KV_I8) {
        const size_t slot = block_base / m->head_dim;
        for (int i = 0; i < m->block_size; i += 16) prefetch(m->k_scale + slot + i), prefetch(m->v_scale + slot + i);
    }
}

/* the scores of GN heads (q: the first's) at the 16 positions of K column c of the block at kt ([hd][bs]).
 * GN is a constant at each call (attend_kv's switch), so the accumulators stay in registers. Two
 * sums a head, even and odd d: one chain of hd dependent FMAs a head left the loop waiting on FMA
 * latency (SmolLM2, 3 heads a group: 3 FMAs in flight, not 8). */
INLINE void scores16(const void *k_pool, size_t kt, int bs, int hd, const float *q, int GN, v16 scale, float *out,
                     int stride, int kind, const float *ks) {
    v16 a[SK_SG][2];
    for (int g = 0; g < GN; g++) a[g][0] = a[g][1] = v16_zero();
    for (int d = 0; d < hd; d += 2)
        for (int e = 0; e < 2; e++) {
            const v16 kv = kv_load(k_pool, kt + (size_t)(d + e) * bs, kind);
            for (int g = 0; g < GN; g++) a[g][e] = v16_fmadd(v16_set1(q[(size_t)g * hd + d + e]), kv, a[g][e]);
        }
    if (kind == SK_KV_I8) scale = v16_mul(scale, v16_load(ks)); /* the 16 positions' K scales */
    for (int g = 0; g < GN; g++) v16_store(out + (size_t)g * stride, v16_mul(v16_add(a[g][0], a[g][1]), scale));
}

/* out = softmax weights (sc, rows of stride) times V for GN heads and the JN 16-value chunks of each
 * head from chunk j0, each V chunk loaded once; GN and JN are constants at each call (attend_kv),
 * so the GN x JN accumulators stay in registers (with runtime counts they lived on the stack, a
 * load and a store beside every FMA) */
INLINE void weigh_v(const sk_model *m, size_t base, const int32_t *table, int nblk, int ctx, const float *sc,
                    int stride, const float *inv_sum, int GN, int j0, int JN, float *out, int kind) {
    const int hd = m->head_dim, bs = m->block_size;
    v16 o[SK_SG][SK_VACC];
    for (int g = 0; g < GN; g++)
        for (int j = 0; j < JN; j++) o[g][j] = v16_zero();
    for (int b = 0; b < nblk; b++) {
        const size_t vb = base + (size_t)table[b] * bs * hd + 16 * j0;
        const float *p = sc + b * bs;
        const int n = ctx - b * bs < bs ? ctx - b * bs : bs;
        for (int i = 0; i < n; i++)
            for (int j = 0; j < JN; j++) {
                const v16 v = kv_load(m->v_pool, vb + (size_t)i * hd + 16 * j, kind);
                for (int g = 0; g < GN; g++) o[g][j] = v16_fmadd(v16_set1(p[(size_t)g * stride + i]), v, o[g][j]);
            }
    }
    for (int g = 0; g < GN; g++)
        for (int j = 0; j < JN; j++)
            v16_store(out + (size_t)g * hd + 16 * (j0 + j), v16_mul(o[g][j], v16_set1(inv_sum[g])));
}

/* weigh_v over all HV chunks of GN heads, as many chunks a pass as SK_VACC accumulators allow */
INLINE void weigh_v_heads(const sk_model *m, size_t base, const int32_t *table, int nblk, int ctx, const float *sc,
                          int stride, const float *inv_sum, int GN, float *out, int kind) {
    const int HV = m->head_dim / 16, JN = SK_VACC / GN >= 4 ? 4 : SK_VACC / GN >= 2 ? 2 : 1;
    int j0 = 0;
    for (; j0 + JN <= HV; j0 += JN) weigh_v(m, base, table, nblk, ctx, sc, stride, inv_sum, GN, j0, JN, out, kind);
    for (; j0 < HV; j0++) weigh_v(m, base, table, nblk, ctx, sc, stride, inv_sum, GN, j0, 1, out, kind);
}

/* G consecutive query heads of one token (q, out: the first's), all sharing KV head kvh, over
 * positions 0..ctx-1 of its sequence: scores, softmax with the row maximum subtracted, weighted
 * sum of V. With int8 K/V (kind SK_KV_I8) each position's K scale multiplies its scores and its V
 * scale its softmax weight, so the loops stay those of the float pools. */
INLINE void attend_kv(const sk_model *m, int layer, int kvh, const float *q, int G, int ctx, const int32_t *table,
                      float *out, int kind) {
    const int hd = m->head_dim, bs = m->block_size;
    const int nblk = (ctx + bs - 1) / bs, stride = nblk * bs;
    float *sc = strip_buffer((size_t)G * stride * 4); /* G x context scores: no matmul runs meanwhile */
    const size_t sbase = ((size_t)layer * m->n_kv + kvh) * (size_t)m->pool_slots, base = sbase * hd; /* in slots, elements */
    v16 scale = v16_set1(m->scale);
    float qr[kind == SK_KV_I8 ? G * hd : 1]; /* the queries rotated as K was (kv_rotate) */
    if (kind == SK_KV_I8) {
        memcpy(qr, q, (size_t)G * hd * 4);
        for (int g = 0; g < G; g++) kv_rotate(qr + (size_t)g * hd, hd);
        q = qr;
        scale = v16_set1(m->scale / (float)kv_rot_chunk(hd));
    }
    for (int b = 0; b < nblk; b++) {
        const size_t kt = base + (size_t)table[b] * bs * hd; /* [hd][bs] */
        const float *ks = kind == SK_KV_I8 ? m->k_scale + sbase + (size_t)table[b] * bs : NULL;
        if (b + 1 < nblk) prefetch_kv_block(m, base + (size_t)table[b + 1] * bs * hd, kind); /* anywhere in the pool */
        for (int c = 0; c < bs; c += 16)
            for (int g0 = 0; g0 < G; g0 += SK_SG) {
                const float *qg = q + (size_t)g0 * hd;
                float *o = sc + (size_t)g0 * stride + b * bs + c;
                switch (G - g0 < SK_SG ? G - g0 : SK_SG) {
                case 1: scores16(m->k_pool, kt + c, bs, hd, qg, 1, scale, o, stride, kind, ks ? ks + c : NULL); break;
                case 2: scores16(m->k_pool, kt + c, bs, hd, qg, 2, scale, o, stride, kind, ks ? ks + c : NULL); break;
#if SK_SG > 3
                case 3: scores16(m->k_pool, kt + c, bs, hd, qg, 3, scale, o, stride, kind, ks ? ks + c : NULL); break;
#endif
                default: scores16(m->k_pool, kt + c, bs, hd, qg, SK_SG, scale, o, stride, kind, ks ? ks + c : NULL); break;
                }
            }
    }
    float inv_sum[32];
    for (int g = 0; g < G; g++) {
        float *s = sc + (size_t)g * stride;
        for (int p = ctx; p < stride; p++) s[p] = -INFINITY;
        v16 mx = v16_set1(-INFINITY);
        for (int p = 0; p < stride; p += 16) mx = v16_max(mx, v16_load(s + p));
        const v16 vm = v16_set1(v16_hmax(mx));
        v16 sum = v16_zero();
        for (int p = 0; p < stride; p += 16) {
            v16 e = v16_exp(v16_sub(v16_load(s + p), vm));
            if (p + 16 > ctx) e = v16_keep(e, ctx - p);
            v16_store(s + p, e);
            sum = v16_add(sum, e);
        }
        /* int8: V was stored rotated, and the rotation back (below) multiplies by its chunk's size */
        inv_sum[g] = 1.0f / (v16_hsum(sum) * (kind == SK_KV_I8 ? (float)kv_rot_chunk(hd) : 1.0f));
        if (kind == SK_KV_I8) /* each position's V scale into its weight; weigh_v reads no further than ctx */
            for (int b = 0; b < nblk; b++)
                for (int c = 0; c < bs; c += 16) {
                    float *w = s + b * bs + c;
                    v16_store(w, v16_mul(v16_load(w), v16_load(m->v_scale + sbase + (size_t)table[b] * bs + c)));
                }
    }
    for (int g0 = 0; g0 < G; g0 += SK_SG) {
        const float *s = sc + (size_t)g0 * stride;
        float *o = out + (size_t)g0 * hd;
        switch (G - g0 < SK_SG ? G - g0 : SK_SG) {
        case 1: weigh_v_heads(m, base, table, nblk, ctx, s, stride, inv_sum + g0, 1, o, kind); break;
        case 2: weigh_v_heads(m, base, table, nblk, ctx, s, stride, inv_sum + g0, 2, o, kind); break;
#if SK_SG > 3
        case 3: weigh_v_heads(m, base, table, nblk, ctx, s, stride, inv_sum + g0, 3, o, kind); break;
#endif
        default: weigh_v_heads(m, base, table, nblk, ctx, s, stride, inv_sum + g0, SK_SG, o, kind); break;
        }
    }
    if (kind == SK_KV_I8) /* V was stored rotated: rotate the sums back */
        for (int g = 0; g < G; g++) kv_rotate(out + (size_t)g * hd, hd);
}

static void attend(const sk_model *m, int layer, int kvh, const float *q, int G, int ctx, const int32_t *table,
                   float *out) {
    switch (m->kv_kind) { /* a constant in each copy */
    case SK_KV_F16: attend_kv(m, layer, kvh, q, G, ctx, table, out, SK_KV_F16); break;
    case SK_KV_I8: attend_kv(m, layer, kvh, q, G, ctx, table, out, SK_KV_I8); break;
    default: attend_kv(m, layer, kvh, q, G, ctx, table, out, SK_KV_F32); break;
    }
}

/* where KV head j of `layer` keeps position `slot`, in elements of the pools: its K column at *kt
 * (head_dim values block_size apart: a block is [head_dim][block_size]), its V row at *vr */
INLINE void kv_slot(const sk_model *m, int layer, long slot, int j, size_t *kt, size_t *vr) {
    const int hd = m->head_dim, bs = m->block_size;
    const size_t head = ((size_t)layer * m->n_kv + j) * (size_t)m->pool_slots;
    *kt = (head + (size_t)(slot / bs) * bs) * hd + (size_t)(slot % bs);
    *vr = (head + (size_t)slot) * hd;
}

/* hd values of x rotated (kv_rotate) and rounded to int8 at q, stride apart (symmetric, to nearest);
 * returns their scale */
INLINE float kv_quantize(const float *x, int hd, size_t stride, int8_t *q) {
    float r[SK_MAX_HEAD_DIM];
    memcpy(r, x, (size_t)hd * 4);
    kv_rotate(r, hd);
    const float amax = amax_n(r, hd), inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    for (int i = 0; i < hd; i++) q[(size_t)i * stride] = (int8_t)lrintf(r[i] * inv);
    return amax / 127.0f;
}

/* a token's K (rotated by RoPE) and V of KV head j into its slot */
static void write_kv(const sk_model *m, int layer, long slot, int j, const float *kj, const float *vj) {
    const int hd = m->head_dim, bs = m->block_size;
    size_t kt, vr;
    kv_slot(m, layer, slot, j, &kt, &vr);
    if (m->kv_kind == SK_KV_I8) {
        m->k_scale[vr / hd] = kv_quantize(kj, hd, bs, (int8_t *)m->k_pool + kt);
        m->v_scale[vr / hd] = kv_quantize(vj, hd, 1, (int8_t *)m->v_pool + vr);
    } else if (m->kv_kind == SK_KV_F16) {
        uint16_t *kp = (uint16_t *)m->k_pool + kt, *vp = (uint16_t *)m->v_pool + vr;
        for (int d = 0; d < hd; d++) kp[(size_t)d * bs] = _cvtss_sh(kj[d], _MM_FROUND_TO_NEAREST_INT);
        for (int d = 0; d < hd; d += 16) v16_store_half(vp + d, v16_load(vj + d));
    } else {
        float *kp = (float *)m->k_pool + kt;
        for (int d = 0; d < hd; d++) kp[(size_t)d * bs] = kj[d];
        memcpy((float *)m->v_pool + vr, vj, (size_t)hd * 4);
    }
}

INLINE void silu_mul(const float *g, const float *u, int n, float *out) {
    for (int i = 0; i < n; i += 16) {
        const v16 gv = v16_load(g + i);
        const v16 e = v16_exp(v16_sub(v16_zero(), gv));
        v16_store(out + i, v16_mul(v16_div(gv, v16_add(v16_set1(1.0f), e)), v16_load(u + i)));
    }
}

typedef struct {
    sk_model *m;
    int T, R, nb_stride, bf16_min_rows, i8_min_rows, i8_mask, amx;
    const int32_t *ids, *pos, *tok_seq, *tables, *logit_rows;
    const int64_t *slots;
    float *logits;  /* [R][vocab]; scratch where tokens is set */
    int32_t *tokens; /* NULL, or [R]: each logit row's argmax instead of its logits */
} forward_args;

/* this thread's share of T rows of n columns (n a multiple of 16): whole rows [*r0, *r1), or with
 * fewer rows than threads every row's columns [*c0, *c1) (at batch 1 one thread had all of a row
 * and the other waited) */
static void row_share(const sk_team *t, int T, int n, int *r0, int *r1, int *c0, int *c1) {
    if (T < t->nt) {
        *r0 = 0;
        *r1 = T;
        team_span(t, n / 16, c0, c1);
        *c0 *= 16;
        *c1 *= 16;
    } else {
        team_span(t, T, r0, r1);
        *c0 = 0;
        *c1 = n;
    }
}

/* rms_norm of rows [0, T) of x into out, this thread's share (row_share) */
static void norm_rows(const sk_model *m, const float *x, const float *w, int T, float *out, sk_team *t) {
    const int D = m->dim;
    int r0, r1, c0, c1;
    row_share(t, T, D, &r0, &r1, &c0, &c1);
    for (int r = r0; r < r1; r++) rms_norm_cols(x + (size_t)r * D, w, D, m->eps, out + (size_t)r * D, c0, c1);
}

/* rope_write_kv's units: per token, each KV head's K and V, then the G query heads that share it
 * (by KV head with its G query heads, SmolLM2's batch-1 step gave one thread 2 of 3 units and the
 * other waited); this thread's share [*a, *b) of them, and unit u's token, KV head and query head
 * within the group (-1: the K and V) */
static void rope_units(const sk_model *m, int T, const sk_team *t, int *a, int *b) {
    team_span(t, T * m->n_kv * (m->n_heads / m->n_kv + 1), a, b);
}
INLINE void rope_unit(const sk_model *m, int u, int *r, int *kv, int *g) {
    const int per = m->n_heads / m->n_kv + 1, j = u % (m->n_kv * per);
    *r = u / (m->n_kv * per);
    *kv = j / per;
    *g = j % per - 1;
}

/* Rows of a step up to which each layer starts by prefetching the K/V lines its RoPE phase writes
 * (decode-sized steps: a prompt's hundreds of rows would pull megabytes that its long matmuls evict
 * before the writes) */
#define SK_KV_PREFETCH_MAX_ROWS 64

/* the lines rope_write_kv will write for this thread's units of layer l into cache, ahead: a K
 * column is head_dim values block_size apart (32 lines of a 2 KB block in float16), which the
 * write otherwise fetched one by one while the other thread waited at the barrier */
static void prefetch_kv_writes(const forward_args *f, int l, int T, const sk_team *t) {
    const sk_model *m = f->m;
    if (T > SK_KV_PREFETCH_MAX_ROWS) return;
    const int hd = m->head_dim, bs = m->block_size, esize = (int)kv_esize(m->kv_kind);
    const int step = bs * esize >= 64 ? 1 : 64 / (bs * esize); /* K rows a line holds */
    int a, b;
    rope_units(m, T, t, &a, &b);
    for (int u = a; u < b; u++) {
        int r, kv, g;
        rope_unit(m, u, &r, &kv, &g);
        if (g >= 0) continue;
        size_t kt, vr;
        kv_slot(m, l, (long)f->slots[r], kv, &kt, &vr);
        const char *k = (const char *)m->k_pool + kt * esize, *v = (const char *)m->v_pool + vr * esize;
        for (int d = 0; d < hd; d += step) prefetch(k + (size_t)d * bs * esize);
        for (int i = 0; i < hd * esize; i += 64) prefetch(v + i);
        if (m->kv_kind == SK_KV_I8) prefetch(m->k_scale + vr / hd), prefetch(m->v_scale + vr / hd);
    }
}

/* the QKV bias, RoPE and the K/V write of T tokens, this thread's share of rope_units */
static void rope_write_kv(const forward_args *f, const sk_layer *L, int l, int T, sk_team *t) {
    const sk_model *m = f->m;
    const int H = m->n_heads, KV = m->n_kv, hd = m->head_dim, G = H / KV, QKV = (H + 2 * KV) * hd, A = H * hd;
    int a, b;
    rope_units(m, T, t, &a, &b);
    for (int u = a; u < b; u++) {
        int r, kv, g;
        rope_unit(m, u, &r, &kv, &g);
        const float *cs = m->rope_cos + (size_t)f->pos[r] * (hd / 2), *sn = m->rope_sin + (size_t)f->pos[r] * (hd / 2);
        float *row = m->qkv + (size_t)r * QKV;
        if (g >= 0) { /* query head kv G + g */
            const int h = kv * G + g;
            float *q = row + (size_t)h * hd;
            if (L->qkv_bias)
                for (int i = 0; i < hd; i++) q[i] += L->qkv_bias[(size_t)h * hd + i];
            rope(q, 1, hd, cs, sn);
            continue;
        }
        float *k = row + A + (size_t)kv * hd, *v = k + (size_t)KV * hd;
        if (L->qkv_bias) {
            const float *bk = L->qkv_bias + A + (size_t)kv * hd, *bv = bk + (size_t)KV * hd;
            for (int i = 0; i < hd; i++) k[i] += bk[i];
            for (int i = 0; i < hd; i++) v[i] += bv[i];
        }
        rope(k, 1, hd, cs, sn);
        write_kv(m, l, (long)f->slots[r], kv, k, v);
    }
}

/* heads [h0, h0 + n) of row r of the attention's output packed where the output projection reads
 * them (gemv_pack_row_blocks), if o_xb is set */
INLINE void pack_heads(const sk_model *m, int r, int h0, int n, uint8_t *o_xb, int grouped) {
    const int A = m->n_heads * m->head_dim, per = m->head_dim / 32;
    if (o_xb)
        gemv_pack_row_blocks(m->att + (size_t)r * A, A, grouped, o_xb + (size_t)r * gemv_b_stride(A), h0 * per,
                             (h0 + n) * per);
}

/* attention of T tokens, this thread's share. Few tokens (SmolLM2 at batch 1: 3 KV heads of 3
 * query heads each): contiguous runs of query heads, so the threads get as many heads each (by KV
 * head, one thread did 2 of the 3 and the other waited, 4 % of a batch-1 step); else (token, KV
 * head) units interleaved, since prefill rows grow in length. With o_xb each thread packs the heads
 * it attended for the output projection's few-row kernel (grouped: the 4-bit formats' layout), so
 * that starts at the barrier after this (each thread packed all of it, half the lines the other
 * thread's: 2,000-2,500 cycles a layer of SmolLM2's batch-1 step). */
static void attend_rows(const forward_args *f, int l, int T, uint8_t *o_xb, int grouped, sk_team *t) {
    const sk_model *m = f->m;
    const int H = m->n_heads, KV = m->n_kv, hd = m->head_dim, G = H / KV, QKV = (H + 2 * KV) * hd, A = H * hd;
    if (T * KV < 4 * t->nt) {
        int a, b;
        team_span(t, T * H, &a, &b);
        for (int h = a; h < b;) {
            const int r = h / H, hh = h % H, g = hh % G, n = G - g < b - h ? G - g : b - h;
            attend(m, l, hh / G, m->qkv + (size_t)r * QKV + (size_t)hh * hd, n, f->pos[r] + 1,
                   f->tables + (size_t)f->tok_seq[r] * f->nb_stride, m->att + (size_t)r * A + (size_t)hh * hd);
            pack_heads(m, r, hh, n, o_xb, grouped);
            h += n;
        }
        return;
    }
    for (int i = t->tid; i < T * KV; i += t->nt) {
        const int r = i / KV, j = i % KV, nx = i + t->nt;
        if (nx < T * KV) /* the first KV block of this thread's next unit (each prefetches its next ones) */
            prefetch_kv_block(m, ((size_t)l * KV + nx % KV) * (size_t)m->pool_slots * hd +
                                     (size_t)f->tables[(size_t)f->tok_seq[nx / KV] * f->nb_stride] * m->block_size * hd,
                              m->kv_kind);
        attend(m, l, j, m->qkv + (size_t)r * QKV + (size_t)j * G * hd, G, f->pos[r] + 1,
               f->tables + (size_t)f->tok_seq[r] * f->nb_stride, m->att + (size_t)r * A + (size_t)j * G * hd);
        pack_heads(m, r, j * G, G, o_xb, grouped);
    }
}

/* SwiGLU of rows [0, T) of gu into out [T][ffn], this thread's share (row_share) */
static void silu_rows(const sk_model *m, int T, float *out, sk_team *t) {
    const int F = m->ffn;
    int r0, r1, c0, c1;
    row_share(t, T, F, &r0, &r1, &c0, &c1);
    for (int r = r0; r < r1; r++) {
        const float *g = m->gu + (size_t)r * 2 * F;
        silu_mul(g + c0, g + F + c0, c1 - c0, out + (size_t)r * F + c0);
    }
}

/* index of the first maximum of x[0, n): chunk maxima in a vector pass, then a scan of the first
 * chunk that holds the maximum (numpy's argmax picks the same index) */
#define SK_ARGMAX_CHUNK 256
static int argmax_row(const float *x, int n) {
    float best = x[0];
    int best_chunk = 0;
    for (int c0 = 0; c0 < n; c0 += SK_ARGMAX_CHUNK) {
        const int c1 = c0 + SK_ARGMAX_CHUNK < n ? c0 + SK_ARGMAX_CHUNK : n;
        int j = c0;
        float mx = x[c0];
        if (c1 - c0 >= 16) {
            v16 vm = v16_load(x + c0);
            for (j = c0 + 16; j + 16 <= c1; j += 16) vm = v16_max(vm, v16_load(x + j));
            mx = v16_hmax(vm);
        }
        for (; j < c1; j++) mx = x[j] > mx ? x[j] : mx;
        if (mx > best) best = mx, best_chunk = c0;
    }
    for (int j = best_chunk; j < n; j++)
        if (x[j] == best) return j;
    return best_chunk; /* NaN logits: no value compares equal */
}

/* each of R rows' token by the head's 4-bit copy (sk_head4.h): its logits into `logits` [R][n]
 * (scratch) through the matmuls' usual dispatch, then each row's kept columns exactly */
static void head4_team(const sk_w *head, const h4_head *h, int R, const float *x, int ldx, float *logits, int amr,
                       int i8, int i8_two, int gemv, uint32_t *xb, int32_t *tokens, sk_team *t) {
    const int V = head->n;
    int a, b;
    matmul_team(&h->w, R, x, ldx, logits, V, 0, amr, i8, i8_two, gemv, xb, t);
    float *tmp = strip_buffer((size_t)head->k * 4);
    if (R < t->nt) { /* fewer rows than threads: each row by all of them */
        for (int r = 0; r < R; r++) {
            if (r) team_barrier(t); /* the threads' parts of the row before are read */
            const int tok = h4_pick_team(head, h, logits + (size_t)r * V, x + (size_t)r * ldx, tmp, t);
            if (!t->tid) tokens[r] = tok < 0 ? 0 : tok;
        }
        return;
    }
    team_span(t, R, &a, &b);
    for (int r = a; r < b; r++) {
        const int tok = h4_pick(head, h, logits + (size_t)r * V, x + (size_t)r * ldx, tmp);
        tokens[r] = tok < 0 ? 0 : tok;
    }
}

/* the head's rows into f->tokens: each row's first largest logit. The greedy head (sk_greedy.h) or
 * the 4-bit copy (sk_head4.h) where the head's format and the row count take them, else every
 * logit and a scan. */
static void head_argmax(const forward_args *f, int amr, int i8, int i8_two, int gemv, sk_team *t) {
    sk_model *m = f->m;
    const int R = f->R, D = m->dim, V = m->vocab;
    int a, b;
#if SK_GREEDY
    if (m->gh.corr && R >= SK_GREEDY_MIN_ROWS) {
        greedy_head_team(&m->head, &m->gh, R, m->lx, D, f->logits, (size_t)R * V * 4, m->xb, f->tokens, t);
        return;
    }
#endif
    if (m->h4.w.qs && R < SK_GREEDY_MIN_ROWS) {
        head4_team(&m->head, &m->h4, R, m->lx, D, f->logits, amr, i8, i8_two, gemv, m->xb, f->tokens, t);
        return;
    }
    matmul_team(&m->head, R, m->lx, D, f->logits, V, 0, amr, i8, i8_two, gemv, m->xb, t);
    team_span(t, R, &a, &b);
    for (int r = a; r < b; r++) f->tokens[r] = argmax_row(f->logits + (size_t)r * V, V);
}

/* y [M][ldy] = x . W^T for a fused matrix, one matmul_team a part */
static void matmul_parts(const sk_parts *p, int M, const float *x, int ldx, float *y, int ldy, int bf16_min_rows,
                         int i8_min_rows, int i8_two, int gemv, uint32_t *xb, sk_team *t) {
    for (int j = 0, c = 0; j < p->n_parts; c += p->w[j].n, j++)
        matmul_team(&p->w[j], M, x, ldx, y + c, ldy, 0, bf16_min_rows, i8_min_rows, i8_two, gemv, xb, t);
}

/* Whether a matmul of M rows over these parts runs as mm_gemv_own_team: every part takes the
 * few-row kernel and x is small enough to pack twice (SK_GEMV_OWN_MAX). At batch 1 on 2 threads
 * a layer's phase ends drop from 13 to 6 (SmolLM2: the norms and the SwiGLU go into the packing,
 * and so do their barriers, as does each pack's). */
static int own_x(const sk_w *parts, int n_parts, int M, int gemv) {
    if (!gemv || !g_gemv_own_x || M * parts[0].k > SK_GEMV_OWN_MAX) return 0;
    for (int j = 0; j < n_parts; j++)
        if (!use_gemv(&parts[j], M, gemv)) return 0;
    return 1;
}

/* Whether the attention packs its output for the output projection (attend_rows' o_xb): the
 * projection takes the few-row kernel on a layout with a scale per block of 32 (a K-quant's x has
 * one per 256: heads of 64 values are no unit of it), and a head is whole blocks. Where the tests
 * turn own_x off, the team packs it in shares instead. */
static int attention_packs_o(const sk_model *m, const sk_w *o, int T, int gemv) {
    return gemv && g_gemv_own_x && use_gemv(o, T, gemv) && gemv_block_format(o->fmt) && m->head_dim % 32 == 0;
}

/* rms_norm of rows [0, T) of x, all of it by this thread (a team of one), into its SCRATCH_ROWS buffer */
static float *own_norm_rows(const sk_model *m, const float *x, const float *w, int T) {
    float *out = thread_buffer(SCRATCH_ROWS, (size_t)T * m->dim * 4);
    sk_team solo = {0, 1, 0, 0};
    norm_rows(m, x, w, T, out, &solo);
    return out;
}

/* SwiGLU of rows [0, T) of gu, all of it by this thread (a team of one), into its SCRATCH_ROWS buffer */
static float *own_silu_rows(const sk_model *m, int T) {
    float *out = thread_buffer(SCRATCH_ROWS, (size_t)T * m->ffn * 4);
    sk_team solo = {0, 1, 0, 0};
    silu_rows(m, T, out, &solo);
    return out;
}

static void forward_job(void *p, sk_team *t) {
    const forward_args *f = p;
#define I8(bit) ((f->i8_mask & (bit)) ? f->i8_min_rows : 0) /* the int8 threshold of one matmul */
#define I8_TWO ((f->i8_mask & 32) != 0)
#define GEMV ((f->i8_mask & SK_GEMV) != 0)
    sk_model *m = f->m;
    const int T = f->T, D = m->dim, F = m->ffn, A = m->n_heads * m->head_dim;
    const int QKV = A + 2 * m->n_kv * m->head_dim, amr = f->bf16_min_rows;
    int a, b;
    team_begin(f->amx);
    team_span(t, T, &a, &b);
    for (int r = a; r < b; r++) dq_row(&m->embed, f->ids[r], m->x + (size_t)r * D);
    team_barrier(t);
    for (int l = 0; l < m->n_layers; l++) {
        const sk_layer *L = &m->layers[l];
        prefetch_kv_writes(f, l, T, t);
        if (own_x(L->qkv.w, L->qkv.n_parts, T, GEMV)) {
            mm_gemv_own_team(L->qkv.w, L->qkv.n_parts, T, own_norm_rows(m, m->x, L->attn_norm, T), D, m->qkv, QKV, 0,
                             I8_TWO, t);
        } else {
            norm_rows(m, m->x, L->attn_norm, T, m->h, t);
            team_barrier(t);
            matmul_parts(&L->qkv, T, m->h, D, m->qkv, QKV, amr, I8(1), I8_TWO, GEMV, m->xb, t);
        }
        rope_write_kv(f, L, l, T, t);
        team_barrier(t);
        const int o_packed = attention_packs_o(m, &L->o, T, GEMV);
        attend_rows(f, l, T, o_packed ? (uint8_t *)m->xb : NULL, gemv_pack_kind(L->o.fmt) == GEMV_PACK_GROUPED, t);
        team_barrier(t);
        if (o_packed) mm_gemv_packed_team(&L->o, T, (uint8_t *)m->xb, m->x, D, 1, I8_TWO, t);
        else if (own_x(&L->o, 1, T, GEMV)) mm_gemv_own_team(&L->o, 1, T, m->att, A, m->x, D, 1, I8_TWO, t);
        else matmul_team(&L->o, T, m->att, A, m->x, D, 1, amr, I8(2), I8_TWO, GEMV, m->xb, t);
        if (own_x(L->gu.w, L->gu.n_parts, T, GEMV)) {
            mm_gemv_own_team(L->gu.w, L->gu.n_parts, T, own_norm_rows(m, m->x, L->ffn_norm, T), D, m->gu, 2 * F, 0,
                             I8_TWO, t);
        } else {
            norm_rows(m, m->x, L->ffn_norm, T, m->h, t);
            team_barrier(t);
            matmul_parts(&L->gu, T, m->h, D, m->gu, 2 * F, amr, I8(4), I8_TWO, GEMV, m->xb, t);
        }
        if (own_x(&L->down, 1, T, GEMV)) {
            mm_gemv_own_team(&L->down, 1, T, own_silu_rows(m, T), F, m->x, D, 1, I8_TWO, t);
        } else {
            silu_rows(m, T, m->act, t);
            team_barrier(t);
            matmul_team(&L->down, T, m->act, F, m->x, D, 1, amr, I8(8), I8_TWO, GEMV, m->xb, t);
        }
    }
    int c0, c1;
    row_share(t, f->R, D, &a, &b, &c0, &c1);
    for (int r = a; r < b; r++)
        rms_norm_cols(m->x + (size_t)f->logit_rows[r] * D, m->out_norm, D, m->eps, m->lx + (size_t)r * D, c0, c1);
    team_barrier(t);
    if (f->tokens) head_argmax(f, amr, I8(16), I8_TWO, GEMV, t);
    else matmul_team(&m->head, f->R, m->lx, D, f->logits, m->vocab, 0, amr, I8(16), I8_TWO, GEMV, m->xb, t);
    team_end(f->amx);
#undef I8
#undef I8_TWO
#undef GEMV
}

/* One step over T tokens of any mix of sequences. Token t sits at position pos[t] of the sequence
 * whose block table is tables[tok_seq[t]] (nb_stride entries per row); its K/V go to slot slots[t],
 * and it attends to positions 0..pos[t] (its own included). Logits [R][vocab] for rows logit_rows,
 * on nt threads (0: all CPUs). Matmuls of at least bf16_min_rows rows run in bf16 (0: never), of at
 * least i8_min_rows in int8 where i8_mask has their bit (1 qkv, 2 o, 4 gate/up, 8 down, 16 LM head;
 * 32: activations as two int8 terms; 64: steps of few rows in int8 where sk_gemv.h takes them).
 * Returns 0; -1 when scratch memory could not be allocated, -2 for a token id or position out of range,
 * -4 when a layer's fused matrices lack parts (sk_model_add_part). */
static int forward_rows(sk_model *m, int T, const int32_t *ids, const int32_t *pos, const int64_t *slots,
                        const int32_t *tok_seq, const int32_t *tables, int nb_stride, int R, const int32_t *logit_rows,
                        float *logits, int32_t *tokens, int bf16_min_rows, int i8_min_rows, int i8_mask, int nt) {
    for (int t = 0; t < T; t++)
        if (ids[t] < 0 || ids[t] >= m->vocab || pos[t] < 0 || pos[t] >= m->rope_len) return -2;
    for (int r = 0; r < R; r++)
        if (logit_rows[r] < 0 || logit_rows[r] >= T) return -2;
    for (int l = 0; l < m->n_layers; l++) {
        const sk_layer *L = &m->layers[l];
        if (parts_rows(&L->qkv) != L->qkv.rows || parts_rows(&L->gu) != L->gu.rows) return -4;
    }
    if (ensure_scratch(m, T, R)) return -1;
    if (tokens && R >= SK_GREEDY_MIN_ROWS && !m->gh_tried) { /* 8 bytes a block: made for models that use it */
        m->gh = gh_prepare(&m->head);
        m->gh_tried = 1;
    }
    if (nt <= 0) nt = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (tokens && R < SK_GREEDY_MIN_ROWS && !m->h4_tried) { /* 24 bytes a block of 32 more */
        m->h4 = h4_prepare(&m->head, nt);
        m->h4_tried = 1;
    }
    forward_args f = {m, T, R, nb_stride, bf16_min_rows, i8_min_rows, i8_mask,
                      SK_AMX && g_amx && bf16_min_rows > 0 && (T >= bf16_min_rows || R >= bf16_min_rows),
                      ids, pos, tok_seq, tables, logit_rows, slots, logits, tokens};
    pool_run(forward_job, &f, nt);
    return 0;
}

SK_API int sk_forward(sk_model *m, int T, const int32_t *ids, const int32_t *pos, const int64_t *slots,
                      const int32_t *tok_seq, const int32_t *tables, int nb_stride, int R, const int32_t *logit_rows,
                      float *logits, int bf16_min_rows, int i8_min_rows, int i8_mask, int nt) {
    return forward_rows(m, T, ids, pos, slots, tok_seq, tables, nb_stride, R, logit_rows, logits, NULL, bf16_min_rows,
                        i8_min_rows, i8_mask, nt);
}

/* sk_forward for greedy rows: each logit row's argmax into tokens [R] (the first largest logit; the
 * greedy head of sk_greedy.h where the head's format and R take it), logits [R][vocab] scratch */
SK_API int sk_forward_argmax(sk_model *m, int T, const int32_t *ids, const int32_t *pos, const int64_t *slots,
                             const int32_t *tok_seq, const int32_t *tables, int nb_stride, int R,
                             const int32_t *logit_rows, float *logits, int32_t *tokens, int bf16_min_rows,
                             int i8_min_rows, int i8_mask, int nt) {
    return forward_rows(m, T, ids, pos, slots, tok_seq, tables, nb_stride, R, logit_rows, logits, tokens,
                        bf16_min_rows, i8_min_rows, i8_mask, nt);
}

/* ------------------------------------------------------------------ sampling (sk_sample.h) */

static int sample_token(float *z, int V, const sample_spec *s) {
    sample_penalize(z, V, s);
    return s->temperature > 0.0f ? sample_draw(z, V, s, thread_buffer(SCRATCH_STRIP, (size_t)V * 8)) : argmax_row(z, V);
}

typedef struct {
    float *logits;
    int S, V;
    const sample_spec *spec;
    int32_t *out;
} sample_args;

static void sample_job(void *p, sk_team *t) {
    const sample_args *a = p;
    int r0, r1;
    team_span(t, a->S, &r0, &r1);
    for (int r = r0; r < r1; r++) a->out[r] = sample_token(a->logits + (size_t)r * a->V, a->V, &a->spec[r]);
}

/* each of S rows of logits (overwritten) into out[r], rows spread over nt threads */
static void sample_rows(float *logits, int S, int V, const sample_spec *spec, int32_t *out, int nt) {
    sample_args a = {logits, S, V, spec, out};
    pool_run(sample_job, &a, S < nt ? S : nt);
}

static size_t seen_stride(int V) { return ((size_t)V + 7) / 8; }

/* the specs of S rows from the entry points' arrays; seen: S rows of seen_stride bytes, or NULL */
static void sample_specs(sample_spec *spec, int S, int V, const float *temperature, const int32_t *top_k,
                         const float *top_p, const float *penalty, const uint64_t *seeds, const uint8_t *seen) {
    for (int i = 0; i < S; i++)
        spec[i] = (sample_spec){temperature[i], top_p[i], penalty[i], top_k[i], seeds[i], 0,
                                seen ? seen + (size_t)i * seen_stride(V) : NULL};
}

/* A token for each of S rows of logits [S][V] (overwritten): the argmax where temperature[i] <= 0,
 * else a draw (sk_sample.h) with the row's top_k (0: off), top_p (1: off), repetition penalty (1:
 * off; seen: S rows of (V + 7) / 8 bytes, bit t of a row set for each token it came after; NULL
 * where no row has a penalty) and seed, at position pos[i] (the position of the token the row's
 * logits came from). Returns 0; -1 where memory for the settings could not be allocated. */
SK_API int sk_sample_rows(float *logits, int S, int V, const float *temperature, const int32_t *top_k,
                          const float *top_p, const float *penalty, const uint64_t *seeds, const int32_t *pos,
                          const uint8_t *seen, int32_t *out, int nt) {
    sample_spec *spec = malloc((size_t)(S > 0 ? S : 1) * sizeof *spec);
    if (!spec) return -1;
    sample_specs(spec, S, V, temperature, top_k, top_p, penalty, seeds, seen);
    for (int i = 0; i < S; i++) spec[i].pos = pos[i];
    if (nt <= 0) nt = (int)sysconf(_SC_NPROCESSORS_ONLN);
    sample_rows(logits, S, V, spec, out, nt);
    free(spec);
    return 0;
}

/* what a decode loop is handed between two of its steps: the steps run so far (their tokens in
 * out[0 .. steps)); nonzero ends the loop there */
typedef int (*sk_deliver_fn)(int steps);

/* up to n_steps decode steps of S sequences (sk_decode_greedy); spec NULL: each token the argmax
 * (the greedy heads), else sampled as sk_sample_rows from every logit, each row's seen bits (spec's,
 * in `seen`) taking the tokens it produces. After each step the loop ends if *stop_flag (NULL: none)
 * is nonzero, which another thread may set at any time; every `deliver_every` steps short of the
 * last it calls deliver (NULL: never), which may end it too. */
static int decode_steps(sk_model *m, int S, int n_steps, const int32_t *ids0, const int32_t *pos0,
                        const int32_t *tables, int nb_stride, const int32_t *stop_ids, int n_stop,
                        const uint8_t *may_stop, sample_spec *spec, uint8_t *seen, float *logits, int32_t *out,
                        int bf16_min_rows, int i8_min_rows, int i8_mask, int nt, const int32_t *stop_flag,
                        int deliver_every, sk_deliver_fn deliver) {
    if (S <= 0 || n_steps <= 0) return -2;
    if (nt <= 0) nt = (int)sysconf(_SC_NPROCESSORS_ONLN);
    const int bs = m->block_size;
    for (int i = 0; i < S; i++)
        if (pos0[i] < 0 || (pos0[i] + n_steps - 1) / bs >= nb_stride) return -3;
    int64_t *slots = malloc((size_t)S * (sizeof(int64_t) + 3 * sizeof(int32_t))); /* the int64s first: aligned */
    if (!slots) return -1;
    int32_t *pos = (int32_t *)(slots + S), *seq = pos + S, *ids = pos + 2 * S;
    for (int i = 0; i < S; i++) seq[i] = i, ids[i] = ids0[i];
    int s = 0, rc = 0, stopped = 0;
    while (s < n_steps && !stopped) {
        for (int i = 0; i < S; i++) {
            pos[i] = pos0[i] + s;
            slots[i] = (int64_t)tables[(size_t)i * nb_stride + pos[i] / bs] * bs + pos[i] % bs;
        }
        int32_t *toks = out + (size_t)s * S;
        rc = forward_rows(m, S, ids, pos, slots, seq, tables, nb_stride, S, seq, logits, spec ? NULL : toks,
                          bf16_min_rows, i8_min_rows, i8_mask, nt);
        if (rc) break;
        if (spec) {
            for (int i = 0; i < S; i++) spec[i].pos = pos[i];
            sample_rows(logits, S, m->vocab, spec, toks, nt);
            for (int i = 0; i < S && seen; i++)
                seen[(size_t)i * seen_stride(m->vocab) + (toks[i] >> 3)] |= (uint8_t)(1u << (toks[i] & 7));
        }
        for (int i = 0; i < S; i++) {
            const int tok = ids[i] = toks[i];
            for (int j = 0; j < n_stop && may_stop[i]; j++) stopped |= tok == stop_ids[j];
        }
        s++;
        if (stopped || s == n_steps) break;
        if (stop_flag && __atomic_load_n(stop_flag, __ATOMIC_ACQUIRE)) break;
        if (deliver && deliver_every > 0 && s % deliver_every == 0 && deliver(s)) break;
    }
    free(slots);
    return rc ? rc : s;
}

/* Up to n_steps greedy decode steps of S sequences, one token each a step, in one call: the token
 * of step s + 1 is the argmax of step s's logits. Sequence i starts from token ids0[i] at position
 * pos0[i]; its block table (tables[i], nb_stride entries) must already cover position
 * pos0[i] + n_steps - 1. Writes out[s][i] and returns the number of steps run: it stops after a
 * step in which a sequence with may_stop[i] set produced one of stop_ids (n_stop of them), so the
 * caller can finish it, after a step that found *stop_flag set (NULL: no flag; another thread
 * sets it: a request to schedule), or where deliver(steps run), called every deliver_every steps
 * short of the last (NULL: never; the caller hands out[0 .. steps) to its streams meanwhile),
 * returns nonzero. Also -1 / -2 as sk_forward, -3 when a table does not cover the positions.
 * logits: scratch [S][vocab]. */
SK_API int sk_decode_greedy(sk_model *m, int S, int n_steps, const int32_t *ids0, const int32_t *pos0,
                            const int32_t *tables, int nb_stride, const int32_t *stop_ids, int n_stop,
                            const uint8_t *may_stop, float *logits, int32_t *out, int bf16_min_rows,
                            int i8_min_rows, int i8_mask, int nt, const int32_t *stop_flag, int deliver_every,
                            sk_deliver_fn deliver) {
    return decode_steps(m, S, n_steps, ids0, pos0, tables, nb_stride, stop_ids, n_stop, may_stop, NULL, NULL, logits,
                        out, bf16_min_rows, i8_min_rows, i8_mask, nt, stop_flag, deliver_every, deliver);
}

/* sk_decode_greedy with each sequence's token drawn as sk_sample_rows draws it (its settings in
 * the arrays of S; seen: S rows of (vocab + 7) / 8 bytes, updated with each token produced, or NULL
 * where no sequence has a repetition penalty) */
SK_API int sk_decode_sample(sk_model *m, int S, int n_steps, const int32_t *ids0, const int32_t *pos0,
                            const int32_t *tables, int nb_stride, const int32_t *stop_ids, int n_stop,
                            const uint8_t *may_stop, const float *temperature, const int32_t *top_k,
                            const float *top_p, const float *penalty, const uint64_t *seeds, uint8_t *seen,
                            float *logits, int32_t *out, int bf16_min_rows, int i8_min_rows, int i8_mask, int nt,
                            const int32_t *stop_flag, int deliver_every, sk_deliver_fn deliver) {
    if (S <= 0) return -2;
    sample_spec *spec = malloc((size_t)S * sizeof *spec);
    if (!spec) return -1;
    sample_specs(spec, S, m->vocab, temperature, top_k, top_p, penalty, seeds, seen);
    const int rc = decode_steps(m, S, n_steps, ids0, pos0, tables, nb_stride, stop_ids, n_stop, may_stop, spec, seen,
                                logits, out, bf16_min_rows, i8_min_rows, i8_mask, nt, stop_flag, deliver_every,
                                deliver);
    free(spec);
    return rc;
}

/* ------------------------------------------------------------------ test entry points */

typedef struct {
    sk_w w;
    int M, acc, bf16_min_rows, i8_min_rows, i8_two, gemv, amx;
    const float *x;
    float *y;
    uint32_t *xb;
} matmul_args;

static void matmul_job(void *p, sk_team *t) {
    const matmul_args *a = p;
    team_begin(a->amx);
    matmul_team(&a->w, a->M, a->x, a->w.k, a->y, a->w.n, a->acc, a->bf16_min_rows, a->i8_min_rows, a->i8_two, a->gemv, a->xb, t);
    team_end(a->amx);
}

/* y [M][N] (+)= x [M][K] . W^T through the same dispatch as the forward */
SK_API int sk_matmul(int fmt, const uint8_t *qs, const float *sc, int N, int K, int M, const float *x, float *y, int acc,
                     int bf16_min_rows, int i8_min_rows, int i8_mask, int nt) {
    matmul_args a = {{fmt, N, K, qs, sc}, M, acc, bf16_min_rows, i8_min_rows, (i8_mask & 32) != 0,
                     (i8_mask & SK_GEMV) != 0, 0, x, y, NULL};
    const int gemv = use_gemv(&a.w, M, a.gemv);
    a.amx = SK_AMX && g_amx && !gemv && use_bf16(&a.w, M, bf16_min_rows) && !use_i8(&a.w, M, i8_min_rows);
    if ((gemv || use_bf16(&a.w, M, bf16_min_rows) || use_i8(&a.w, M, i8_min_rows)) &&
        !(a.xb = aligned_alloc(64, xb_elems(M, K) * 4)))
        return -1;
    if (nt <= 0) nt = (int)sysconf(_SC_NPROCESSORS_ONLN);
    pool_run(matmul_job, &a, nt);
    free(a.xb);
    return 0;
}

typedef struct {
    sk_w w;
    const gh_prep *gh;
    int M;
    const float *x;
    void *scratch, *xb;
    int32_t *tokens;
} greedy_args;

static void greedy_job(void *p, sk_team *t) {
    const greedy_args *a = p;
#if SK_GREEDY
    greedy_head_team(&a->w, a->gh, a->M, a->x, a->w.k, a->scratch, (size_t)a->M * a->w.n * 4, a->xb, a->tokens, t);
#else
    (void)a; (void)t;
#endif
}

/* each row's argmax of x [M][K] . W^T by the greedy head (sk_greedy.h), whatever the row count.
 * Returns 0; -1 when memory could not be allocated, -4 where this build or W's format has no
 * greedy head. */
SK_API int sk_greedy_head(int fmt, const uint8_t *qs, const float *sc, int N, int K, int M, const float *x,
                          int32_t *tokens, int nt) {
    greedy_args a = {{fmt, N, K, qs, sc}, NULL, M, x, NULL, NULL, tokens};
    if (!SK_GREEDY || !gh_format(&a.w)) return -4;
    gh_prep gh = gh_prepare(&a.w);
    a.gh = &gh;
    a.scratch = aligned_alloc(64, (size_t)M * N * 4 + 64);
    a.xb = aligned_alloc(64, (gh_x_bytes(M, K) + 63) / 64 * 64);
    int rc = -1;
    if (gh.corr && a.scratch && a.xb) {
        if (nt <= 0) nt = (int)sysconf(_SC_NPROCESSORS_ONLN);
        pool_run(greedy_job, &a, nt);
        rc = 0;
    }
    gh_free(&gh);
    free(a.scratch); free(a.xb);
    return rc;
}

typedef struct {
    sk_w head;
    const h4_head *h;
    int M, i8_min_rows, i8_two, gemv;
    const float *x;
    float *logits;
    uint32_t *xb;
    int32_t *tokens;
} head4_args;

static void head4_job(void *p, sk_team *t) {
    const head4_args *a = p;
    head4_team(&a->head, a->h, a->M, a->x, a->head.k, a->logits, 0, a->i8_min_rows, a->i8_two, a->gemv, a->xb,
               a->tokens, t);
}

/* each row's argmax of x [M][K] . W^T by the head's 4-bit copy (sk_head4.h), its matmul dispatched
 * as sk_matmul's by i8_min_rows and i8_mask (no bf16). Returns 0; -1 when memory could not be
 * allocated, -4 where W's format is not Q8_0. */
SK_API int sk_head4_argmax(int fmt, const uint8_t *qs, const float *sc, int N, int K, int M, const float *x,
                           int32_t *tokens, int i8_min_rows, int i8_mask, int nt) {
    head4_args a = {{fmt, N, K, qs, sc}, NULL, M, i8_min_rows, (i8_mask & 32) != 0, (i8_mask & SK_GEMV) != 0,
                    x, NULL, NULL, tokens};
    if (!h4_format(&a.head)) return -4;
    if (nt <= 0) nt = (int)sysconf(_SC_NPROCESSORS_ONLN);
    h4_head h = h4_prepare(&a.head, nt);
    a.h = &h;
    a.logits = malloc((size_t)M * N * 4);
    a.xb = aligned_alloc(64, xb_elems(M, K) * 4);
    int rc = -1;
    if (h.w.qs && a.logits && a.xb) {
        pool_run(head4_job, &a, nt);
        rc = 0;
    }
    h4_free(&h);
    free(a.logits); free(a.xb);
    return rc;
}

/* The read-bandwidth probe of `streamkit bench engine`: the team sums n bytes at p (64-byte aligned,
 * n a multiple of 4096), each thread a contiguous share of pages, with 256-bit loads and the lines
 * 2 KB ahead prefetched as the kernels prefetch theirs. Returns the sum, so the reads stay. */
typedef struct {
    const uint8_t *p;
    int pages;
    int64_t sum;
} read_args;

static void read_job(void *v, sk_team *t) {
    read_args *a = v;
    int i0, i1;
    team_span(t, a->pages, &i0, &i1);
    __m256i s[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
    for (const uint8_t *q = a->p + (size_t)i0 * 4096, *e = a->p + (size_t)i1 * 4096; q < e; q += 128) {
        prefetch(q + 2048);
        prefetch(q + 2048 + 64);
        for (int j = 0; j < 4; j++) s[j] = _mm256_add_epi64(s[j], _mm256_load_si256((const __m256i *)(q + 32 * j)));
    }
    int64_t lanes[4];
    _mm256_storeu_si256((__m256i *)lanes, _mm256_add_epi64(_mm256_add_epi64(s[0], s[1]), _mm256_add_epi64(s[2], s[3])));
    __atomic_fetch_add(&a->sum, lanes[0] + lanes[1] + lanes[2] + lanes[3], __ATOMIC_RELAXED);
}

SK_API long sk_read_sum(const uint8_t *p, long n, int nt) {
    read_args a = {p, (int)(n / 4096), 0};
    if (nt <= 0) nt = (int)sysconf(_SC_NPROCESSORS_ONLN);
    pool_run(read_job, &a, nt);
    return (long)a.sum;
}

/* n GGUF super-blocks of a K-quant (fmt SK_Q4_K, SK_Q5_K or SK_Q6_K), one after another at src, in
 * the kernels' layout (sk_repack.h): qs n * 128 / 160 / 192 bytes, sc n * 6 floats. Returns 0; -2
 * for another format. */
SK_API int sk_repack(int fmt, const uint8_t *src, long n, uint8_t *qs, float *sc) {
    for (long i = 0; i < n; i++) {
        if (fmt == SK_Q4_K) rp_q4_k(src + i * RP_Q4_K_BYTES, qs + i * 128, sc + i * 6);
        else if (fmt == SK_Q5_K) rp_q5_k(src + i * RP_Q5_K_BYTES, qs + i * 160, sc + i * 6);
        else if (fmt == SK_Q6_K) rp_q6_k(src + i * RP_Q6_K_BYTES, qs + i * 192, sc + i * 6);
        else return -2;
    }
    return 0;
}

/* n GGUF Q5_0 blocks at src as the kernels' Q8_0: qs n * 32 int8, d n floats (sk_repack.h) */
SK_API void sk_repack_q5_0(const uint8_t *src, long n, int8_t *qs, float *d) {
    for (long i = 0; i < n; i++) rp_q5_0(src + 22 * i, qs + 32 * i, d + i);
}

/* a weight in the kernels' layout (N rows of K values, K a multiple of 32) as GGUF Q4_0 blocks at out
 * (K / 32 * 18 bytes a row): each row's values as sk_dequant gives them, quantized by sk_repack.h's
 * rp_q4_0. Returns 0; -1 when memory could not be allocated. */
SK_API int sk_requantize_q4_0(int fmt, const uint8_t *qs, const float *sc, int N, int K, uint8_t *out) {
    const sk_w wt = {fmt, N, K, qs, sc};
    float *row = malloc((size_t)K * 4);
    if (!row) return -1;
    for (int n = 0; n < N; n++) {
        dq_row(&wt, n, row);
        for (int b = 0; b < K / 32; b++) rp_q4_0(row + 32 * b, out + ((size_t)n * (K / 32) + b) * 18);
    }
    free(row);
    return 0;
}

/* rows [N][K] of a weight dequantized to fp32 exactly as the matmuls see them */
SK_API void sk_dequant(int fmt, const uint8_t *qs, const float *sc, int N, int K, float *out) {
    const sk_w wt = {fmt, N, K, qs, sc};
    for (int n = 0; n < N; n++) dq_row(&wt, n, out + (size_t)n * K);
}
