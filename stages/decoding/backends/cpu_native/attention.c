/* Attention on CPU: causal prefill chunks (ld_attend_causal) and decode steps over KV slots
   (ld_attend, further down); attention.py builds and calls them (build.py compiles the file
   once per machine, without -march=native).

   Decode steps: a decode step has few queries per KV head (query heads sharing it x step
   width), so its attention is two streaming passes over each row's keys and values, and
   SDPA's flash kernel runs them at about half the machine's memory rate. ld_attend does
   both passes once per (row, KV head), stopping at the row's last visible key. It saved
   5.5% of the sample night on an AMD EPYC with AVX-512 (jobs/results/cpu-kernels/).
   Contract of ld_attend (row-major data; one call per layer):
   q     [B, G, R, D]  float32, contiguous. Row r of KV head g is query (r / Tq) of the
                       group's heads at step token t = r % Tq (the packing of forward.py).
   k     [B, G, S, D]  float32 or bfloat16 (kv_bf16 = 1), element strides (k_sb, k_sg,
                       k_ss) for the B, G and S axes and 1 for D.
   v     [B, G, S, Dv] as k, strides (v_sb, v_sg, v_ss).
   mask  [B, Tq, L]    uint8, contiguous: query token t of row b sees key j < L iff
                       mask[b, t, j] != 0. Keys past the last visible one are never read.
   out   [B, G, R, Dv] float32, contiguous: softmax(scale * q k^T over visible keys) v.
   A query that sees no key gets zeros. Softmax in float32 with the maximum subtracted.

   Prefill chunks:

   Why a kernel of our own: a CPU prefill's attention is compute-bound, and SDPA's causal
   flash kernel runs it at about half the rate of the model's matrix products. It paid for
   itself in a whole night (the sample night, jobs/results/bench-job/...-causal-kernel-xeon.md:
   78.9 s against 91.1 s with SDPA on an Intel Xeon with AVX-512); of the other CPU kernels
   only the packed linear one (linear.c) did too, on another CPU, and the decode-attention and
   fused-norm kernels were removed (jobs/results/cpu-kernels/).

   Portability: one binary for every x86-64 CPU. The AVX-512 path is compiled for AVX-512
   by the target pragma below, not by the command line, and runs only where the CPU reports
   AVX-512 F/BW/VL at run time (ld_fast_path); ld_attend_causal_portable is the same
   contract in plain C (the reference the tests hold the fast path to, and what the tests
   run on every machine). Off x86-64 only the portable path is built.

   Contract of both entry points (float32, one sequence, D a multiple of 16 up to 128):
   T query tokens at positions off .. off+T-1 attend causally over keys 0 .. off+T-1 (query
   t sees keys j <= off + t). q: element (h, t, d) at q[h*q_sh + t*q_st + d], already
   projected and rotated; k, v: (g, j, d) at k[g*k_sg + j*k_ss + d]; out: (t, h, d) at
   out[t*o_st + h*o_sh + d]. Hq = G * rep heads; head h uses KV head h / rep. Softmax in
   float32 with the row maximum subtracted. Returns 0, -1 when scratch memory could not be
   allocated (out is then undefined), -2 when the fast path is not compiled in. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define LD_CAUSAL_ARGS const float* q, const float* k, const float* v, float* out, \
        int64_t G, int64_t rep, int64_t T, int64_t off, int64_t D, \
        int64_t q_sh, int64_t q_st, int64_t k_sg, int64_t k_ss, int64_t v_sg, int64_t v_ss, \
        int64_t o_st, int64_t o_sh, float scale, int threads

/* Portable path: per (query position, head), scores over its visible keys, softmax, output. */
int ld_attend_causal_portable(LD_CAUSAL_ARGS) {
    const int64_t S = off + T;
    int failed = 0;
#pragma omp parallel num_threads(threads) reduction(| : failed)
    {
        float* s = (float*)malloc(sizeof(float) * (size_t)(S > 0 ? S : 1));
        float* acc = (float*)malloc(sizeof(float) * (size_t)D);
        if (!s || !acc) failed = 1;
#pragma omp for schedule(dynamic, 4)
        for (int64_t task = 0; task < T * G * rep; ++task) {
            if (failed) continue;
            const int64_t t = task / (G * rep), h = task % (G * rep), g = h / rep;
            const int64_t nv = off + t + 1;
            const float* qr = q + h * q_sh + t * q_st;
            float top = -INFINITY;
            for (int64_t j = 0; j < nv; ++j) {
                const float* kr = k + g * k_sg + j * k_ss;
                float dot = 0.0f;
                for (int64_t d = 0; d < D; ++d) dot += qr[d] * kr[d];
                s[j] = dot * scale;
                if (s[j] > top) top = s[j];
            }
            float sum = 0.0f;
            for (int64_t j = 0; j < nv; ++j) { s[j] = expf(s[j] - top); sum += s[j]; }
            for (int64_t d = 0; d < D; ++d) acc[d] = 0.0f;
            for (int64_t j = 0; j < nv; ++j) {
                const float* vr = v + g * v_sg + j * v_ss;
                const float p = s[j];
                for (int64_t d = 0; d < D; ++d) acc[d] += p * vr[d];
            }
            float* dst = out + t * o_st + h * o_sh;
            const float inv = 1.0f / sum;
            for (int64_t d = 0; d < D; ++d) dst[d] = acc[d] * inv;
        }
        free(s); free(acc);
    }
    return failed ? -1 : 0;
}

/* ---- Decode steps over KV slots (ld_attend) ------------------------------------------ */
/* Software prefetch distance of the AVX-512 decode path: the rows ~2 KB ahead (8 float32 or
   16 bfloat16 rows of 64 elements); without it the loads stall on DRAM latency (the sweep:
   jobs/results/code-choices.md, this file's section). Prefetching past an allocation's end
   never faults. */
#define PREFETCH_BYTES 2048

static inline float bf16_to_f32(uint16_t x) {
    union { uint32_t u; float f; } c;
    c.u = (uint32_t)x << 16;
    return c.f;
}

/* Number of keys a row must read: one past the last key any of its Tq queries sees. */
static int64_t visible_span(const uint8_t* m, int64_t Tq, int64_t L) {
    int64_t n = 0;
    for (int64_t t = 0; t < Tq; ++t) {
        const uint8_t* row = m + t * L;
        for (int64_t j = L - 1; j >= n; --j) {
            if (row[j]) { n = j + 1; break; }
        }
    }
    return n;
}

/* One (row, KV head), portable C: the same arithmetic order per query, libm's expf. */
static void attend_one_portable(const float* q, const char* kb, const char* vb, int64_t k_ss, int64_t v_ss, int bf16,
                                const uint8_t* m, float* o, int64_t R, int64_t D, int64_t Dv, int64_t Tq, int64_t L,
                                int64_t n, float scale, float* scores) {
    for (int64_t r = 0; r < R; ++r) {
        const uint8_t* mr = m + (r % Tq) * L;
        float* s = scores + r * n;
        float top = -INFINITY;
        for (int64_t j = 0; j < n; ++j) {
            if (!mr[j]) continue;
            float dot = 0.0f;
            for (int64_t d = 0; d < D; ++d) {
                float kd = bf16 ? bf16_to_f32(((const uint16_t*)kb)[j * k_ss + d]) : ((const float*)kb)[j * k_ss + d];
                dot += q[r * D + d] * scale * kd;
            }
            s[j] = dot;
            if (dot > top) top = dot;
        }
        float total = 0.0f;
        for (int64_t j = 0; j < n; ++j) {
            s[j] = mr[j] ? expf(s[j] - top) : 0.0f;
            total += s[j];
        }
        float* orow = o + r * Dv;
        for (int64_t d = 0; d < Dv; ++d) orow[d] = 0.0f;
        for (int64_t j = 0; j < n; ++j) {
            if (s[j] == 0.0f) continue;
            for (int64_t d = 0; d < Dv; ++d) {
                float vd = bf16 ? bf16_to_f32(((const uint16_t*)vb)[j * v_ss + d]) : ((const float*)vb)[j * v_ss + d];
                orow[d] += s[j] * vd;
            }
        }
        float inv = total > 0.0f ? 1.0f / total : 0.0f;
        for (int64_t d = 0; d < Dv; ++d) orow[d] *= inv;
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
/* Whether this CPU runs the AVX-512 path (the path the whole-night measurement was made with). */
int ld_fast_path(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
}

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,fma")
#include <immintrin.h>

/* Of lanes j..j+15, those below n (none when j >= n). */
static inline __attribute__((unused)) __mmask16 lanes_below(int64_t n, int64_t j) {
    return (n - j >= 16) ? 0xFFFF : (n > j ? (__mmask16)((1u << (n - j)) - 1) : 0);
}

/* e^x for x <= 0 (lanes below -87.3 give 0: e^-87.3 is below float32's smallest normal). */
static inline __attribute__((unused)) __m512 exp_nonpositive(__m512 x) {
    const __m512 log2e = _mm512_set1_ps(1.44269504088896341f);
    const __m512 ln2_hi = _mm512_set1_ps(0.693359375f);
    const __m512 ln2_lo = _mm512_set1_ps(-2.12194440e-4f);
    __mmask16 tiny = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3f), _CMP_LT_OQ);
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, ln2_hi, x);
    r = _mm512_fnmadd_ps(n, ln2_lo, r); /* |r| <= ln2 / 2 */
    __m512 p = _mm512_set1_ps(1.0f / 5040);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_maskz_mov_ps(~tiny, _mm512_scalef_ps(p, n));
}

#define LD_DECODE_FAST 1
/* 16 keys' or values' elements as float32 from float32 or bfloat16 memory (first `count` lanes). */
static inline __m512 load16(const void* p, int bf16, __mmask16 lanes) {
    if (bf16) {
        __m256i h = _mm256_maskz_loadu_epi16(lanes, p);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    return _mm512_maskz_loadu_ps(lanes, p);
}

/* One key or value row of `dim` elements as dim / 16 float32 vectors; prefetches the row
   `ahead` bytes further on. */
static inline void load_row(__m512* dst, const char* row, int64_t dim, int64_t esz, int bf16, int64_t ahead) {
    for (int64_t c = 0; c < dim * esz; c += 64) _mm_prefetch(row + ahead + c, _MM_HINT_T0);
    for (int64_t c = 0; c < dim / 16; ++c) dst[c] = load16(row + c * 16 * esz, bf16, 0xFFFF);
}


/* Of keys j..j+15 (those below n): which exist (*lanes) and which the query row sees (returned). */
static inline __mmask16 seen_lanes(const uint8_t* mask_row, int64_t j, int64_t n, __mmask16* lanes) {
    *lanes = lanes_below(n, j);
    return _mm_mask_cmpneq_epi8_mask(*lanes, _mm_maskz_loadu_epi8(*lanes, mask_row + j), _mm_setzero_si128());
}


/* One (row, KV head): scores, softmax, weighted values, AVX-512. */
static void attend_one(const float* q, const char* kb, const char* vb, int64_t k_ss, int64_t v_ss, int bf16,
                       const uint8_t* m, float* o, int64_t R, int64_t D, int64_t Dv, int64_t Tq, int64_t L,
                       int64_t n, float scale, float* scores, float* qs) {
    const int64_t esz = bf16 ? 2 : 4;
    const int64_t dc = D / 16, vc = Dv / 16;
    const int64_t pf_k = (PREFETCH_BYTES / (D * esz) + 1) * k_ss * esz; /* bytes ahead, whole rows */
    const int64_t pf_v = (PREFETCH_BYTES / (Dv * esz) + 1) * v_ss * esz;
    for (int64_t i = 0; i < R * D; ++i) qs[i] = q[i] * scale;
    /* pass 1: scores[r, j] = q_r . k_j; one read of each key for all R queries */
    for (int64_t j = 0; j < n; ++j) {
        __m512 kv[16];
        load_row(kv, kb + j * k_ss * esz, D, esz, bf16, pf_k);
        for (int64_t r = 0; r < R; ++r) {
            const float* qr = qs + r * D;
            __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(qr), kv[0]);
            for (int64_t c = 1; c < dc; ++c) acc = _mm512_fmadd_ps(_mm512_loadu_ps(qr + 16 * c), kv[c], acc);
            scores[r * n + j] = _mm512_reduce_add_ps(acc);
        }
    }
    /* softmax per query row over its visible keys (masked keys weigh exactly 0) */
    for (int64_t r = 0; r < R; ++r) {
        float* s = scores + r * n;
        const uint8_t* mr = m + (r % Tq) * L;
        __m512 mx = _mm512_set1_ps(-INFINITY);
        __mmask16 lanes;
        for (int64_t j = 0; j < n; j += 16) {
            __mmask16 seen = seen_lanes(mr, j, n, &lanes);
            mx = _mm512_mask_max_ps(mx, seen, mx, _mm512_maskz_loadu_ps(seen, s + j));
        }
        float top = _mm512_reduce_max_ps(mx);
        __m512 sum = _mm512_setzero_ps();
        __m512 topv = _mm512_set1_ps(top);
        for (int64_t j = 0; j < n; j += 16) {
            __mmask16 seen = seen_lanes(mr, j, n, &lanes);
            __m512 e = _mm512_maskz_mov_ps(seen, exp_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(seen, s + j), topv)));
            _mm512_mask_storeu_ps(s + j, lanes, e);
            sum = _mm512_add_ps(sum, e);
        }
        float total = _mm512_reduce_add_ps(sum);
        qs[r] = total > 0.0f ? 1.0f / total : 0.0f; /* qs is free now: reuse for 1 / sum */
    }
    /* pass 2: o_r = sum_j p[r, j] v_j / sum_r; one read of each value for all R queries */
    float* acc = o; /* out rows accumulate in place */
    memset(acc, 0, sizeof(float) * R * Dv);
    for (int64_t j = 0; j < n; ++j) {
        __m512 vv[16];
        load_row(vv, vb + j * v_ss * esz, Dv, esz, bf16, pf_v);
        for (int64_t r = 0; r < R; ++r) {
            float p = scores[r * n + j];
            if (p == 0.0f) continue;
            __m512 pv = _mm512_set1_ps(p);
            float* ar = acc + r * Dv;
            for (int64_t c = 0; c < vc; ++c)
                _mm512_storeu_ps(ar + 16 * c, _mm512_fmadd_ps(pv, vv[c], _mm512_loadu_ps(ar + 16 * c)));
        }
    }
    for (int64_t r = 0; r < R; ++r) {
        __m512 inv = _mm512_set1_ps(qs[r]);
        for (int64_t c = 0; c < vc; ++c) _mm512_storeu_ps(acc + r * Dv + 16 * c, _mm512_mul_ps(inv, _mm512_loadu_ps(acc + r * Dv + 16 * c)));
    }
}

/* The AVX-512 path. Keys are transposed into panels of 16
   once per call, then each task (a few query positions x the heads sharing a KV head) computes
   its scores in register tiles of 12 rows x 32 keys, a float32 softmax over each row's
   visible keys, and its output in register tiles of rows x D. */
#define QK_ROWS 12   /* query rows per score tile (x 32 keys: 24 accumulators) */
#define PV_ACC 24    /* accumulators of a value tile: rows x D / 16 */

/* scores[r][j0 .. j0+16*np) for rows r < nr (<= QK_ROWS), np = 1 or 2 key panels. */
static inline __attribute__((always_inline)) void qk_tile(const float* qs, int64_t D, const float* kt0,
        float* s, int64_t ls, int nr, int np) {
    __m512 acc[QK_ROWS][2];
    for (int r = 0; r < QK_ROWS; ++r) { acc[r][0] = _mm512_setzero_ps(); acc[r][1] = _mm512_setzero_ps(); }
    const float* kt1 = kt0 + 16 * D;
    for (int64_t d = 0; d < D; ++d) {
        __m512 k0 = _mm512_loadu_ps(kt0 + 16 * d);
        __m512 k1 = np > 1 ? _mm512_loadu_ps(kt1 + 16 * d) : k0;
        for (int r = 0; r < QK_ROWS; ++r) {
            if (r >= nr) break;
            __m512 qv = _mm512_set1_ps(qs[r * D + d]);
            acc[r][0] = _mm512_fmadd_ps(qv, k0, acc[r][0]);
            if (np > 1) acc[r][1] = _mm512_fmadd_ps(qv, k1, acc[r][1]);
        }
    }
    for (int r = 0; r < QK_ROWS; ++r) {
        if (r >= nr) break;
        _mm512_storeu_ps(s + r * ls, acc[r][0]);
        if (np > 1) _mm512_storeu_ps(s + r * ls + 16, acc[r][1]);
    }
}

static void qk_rows(const float* qs, int64_t D, const float* kt, float* s, int64_t ls, int nr, int64_t panels) {
    int64_t p = 0;
    for (; p + 2 <= panels; p += 2) {
        const float* k = kt + p * 16 * D; float* o = s + p * 16;
        switch (nr) {
#define CASE(N) case N: qk_tile(qs, D, k, o, ls, N, 2); break;
            CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8) CASE(9) CASE(10) CASE(11) default: qk_tile(qs, D, k, o, ls, QK_ROWS, 2);
        }
    }
    if (p < panels) qk_tile(qs, D, kt + p * 16 * D, s + p * 16, ls, nr, 1);
}

/* o rows (nr x D) = P rows (nr x n) . V (n x D), C = D / 16 vectors per row; nr <= PV_ACC / C.
   C is a compile-time constant at every call (the switch below), so the accumulators live in registers. */
static inline __attribute__((always_inline)) void pv_tile(const float* p, int64_t lp, const float* v, int64_t v_ss,
        int64_t n, float* acc_out, int64_t D, int nr, const int C) {
    __m512 acc[PV_ACC];
    const int maxr = PV_ACC / C;
    for (int i = 0; i < PV_ACC; ++i) acc[i] = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; ++j) {
        const float* vr = v + j * v_ss;
        __m512 vv[8];
        for (int c = 0; c < C; ++c) vv[c] = _mm512_loadu_ps(vr + 16 * c);
        for (int r = 0; r < maxr; ++r) {
            if (r >= nr) break;
            __m512 pr = _mm512_set1_ps(p[r * lp + j]);
            for (int c = 0; c < C; ++c) acc[r * C + c] = _mm512_fmadd_ps(pr, vv[c], acc[r * C + c]);
        }
    }
    for (int r = 0; r < maxr; ++r) {
        if (r >= nr) break;
        for (int c = 0; c < C; ++c) _mm512_storeu_ps(acc_out + r * D + 16 * c, acc[r * C + c]);
    }
}

static void pv_rows(const float* p, int64_t lp, const float* v, int64_t v_ss, int64_t n, float* o, int64_t D, int64_t rows) {
    const int64_t C = D / 16;
    const int64_t per = PV_ACC / C;
    for (int64_t r0 = 0; r0 < rows; r0 += per) {
        const int nr = (rows - r0) < per ? (int)(rows - r0) : (int)per;
        const float* pr = p + r0 * lp; float* orow = o + r0 * D;
        switch (C) {
            case 1: pv_tile(pr, lp, v, v_ss, n, orow, D, nr, 1); break;
            case 2: pv_tile(pr, lp, v, v_ss, n, orow, D, nr, 2); break;
            case 3: pv_tile(pr, lp, v, v_ss, n, orow, D, nr, 3); break;
            case 4: pv_tile(pr, lp, v, v_ss, n, orow, D, nr, 4); break;
            case 5: pv_tile(pr, lp, v, v_ss, n, orow, D, nr, 5); break;
            case 6: pv_tile(pr, lp, v, v_ss, n, orow, D, nr, 6); break;
            case 7: pv_tile(pr, lp, v, v_ss, n, orow, D, nr, 7); break;
            default: pv_tile(pr, lp, v, v_ss, n, orow, D, nr, 8); break;
        }
    }
}

int ld_attend_causal(LD_CAUSAL_ARGS) {
    const int64_t S = off + T;
    const int64_t panels = (S + 15) / 16;
    const int64_t C = D / 16;
    int64_t pb = QK_ROWS / rep; if (pb < 1) pb = 1;   /* positions per task */
    const int64_t R = pb * rep;
    const int64_t blocks = (T + pb - 1) / pb;
    float* kt = (float*)malloc(sizeof(float) * (size_t)(G * panels * 16 * D));
    if (!kt) return -1;
    int failed = 0;
#pragma omp parallel num_threads(threads) reduction(| : failed)
    {
        /* keys transposed in panels of 16: kt[g][panel][d][16] (zero past S) */
#pragma omp for schedule(static)
        for (int64_t gp = 0; gp < G * panels; ++gp) {
            const int64_t g = gp / panels, p = gp % panels;
            float* dst = kt + gp * 16 * D;
            for (int64_t i = 0; i < 16; ++i) {
                const int64_t j = p * 16 + i;
                if (j < S) { const float* src = k + g * k_sg + j * k_ss; for (int64_t d = 0; d < D; ++d) dst[d * 16 + i] = src[d]; }
                else for (int64_t d = 0; d < D; ++d) dst[d * 16 + i] = 0.0f;
            }
        }
        float* qs = (float*)malloc(sizeof(float) * (size_t)(R * D));
        float* sc = (float*)malloc(sizeof(float) * (size_t)(R * panels * 16));
        float* ob = (float*)malloc(sizeof(float) * (size_t)(R * D));
        float* inv = (float*)malloc(sizeof(float) * (size_t)R);
        if (!qs || !sc || !ob || !inv) failed = 1;
        const int64_t ls = panels * 16;
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < G * blocks; ++task) {
            if (failed) continue;
            const int64_t g = task % G, b = blocks - 1 - task / G;   /* longest blocks first */
            const int64_t t0 = b * pb, np_ = (T - t0) < pb ? (T - t0) : pb;
            const int64_t rows = np_ * rep;
            /* row r = i * rep + h: position t0 + i, head g * rep + h */
            for (int64_t r = 0; r < rows; ++r) {
                const int64_t i = r / rep, h = g * rep + r % rep;
                const float* src = q + h * q_sh + (t0 + i) * q_st;
                for (int64_t d = 0; d < D; ++d) qs[r * D + d] = src[d] * scale;
            }
            const int64_t n = off + t0 + np_;            /* keys the block's last position sees */
            const int64_t pn = (n + 15) / 16;
            for (int64_t r0 = 0; r0 < rows; r0 += QK_ROWS) {
                const int nr = (rows - r0) < QK_ROWS ? (int)(rows - r0) : QK_ROWS;
                qk_rows(qs + r0 * D, D, kt + g * panels * 16 * D, sc + r0 * ls, ls, nr, pn);
            }
            for (int64_t r = 0; r < rows; ++r) {
                const int64_t nv = off + t0 + r / rep + 1;  /* this row's visible keys */
                float* s = sc + r * ls;
                __m512 mx = _mm512_set1_ps(-INFINITY);
                for (int64_t j = 0; j < nv; j += 16) {
                    const __mmask16 m = lanes_below(nv, j);
                    mx = _mm512_mask_max_ps(mx, m, mx, _mm512_maskz_loadu_ps(m, s + j));
                }
                const __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
                __m512 sum = _mm512_setzero_ps();
                for (int64_t j = 0; j < pn * 16; j += 16) {
                    const __mmask16 m = lanes_below(nv, j);
                    __m512 e = _mm512_maskz_mov_ps(m, exp_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + j), top)));
                    _mm512_storeu_ps(s + j, e);
                    sum = _mm512_add_ps(sum, e);
                }
                inv[r] = 1.0f / _mm512_reduce_add_ps(sum);
            }
            pv_rows(sc, ls, v + g * v_sg, v_ss, n, ob, D, rows);
            for (int64_t r = 0; r < rows; ++r) {
                const int64_t i = r / rep, h = g * rep + r % rep;
                float* dst = out + (t0 + i) * o_st + h * o_sh;
                const __m512 iv = _mm512_set1_ps(inv[r]);
                for (int64_t c = 0; c < C; ++c) _mm512_storeu_ps(dst + 16 * c, _mm512_mul_ps(iv, _mm512_loadu_ps(ob + r * D + 16 * c)));
            }
        }
        free(qs); free(sc); free(ob); free(inv);
    }
    free(kt);
    return failed ? -1 : 0;
}
#pragma GCC pop_options
#else
int ld_fast_path(void) { return 0; }

int ld_attend_causal(LD_CAUSAL_ARGS) {
    (void)q; (void)k; (void)v; (void)out; (void)G; (void)rep; (void)T; (void)off; (void)D; (void)q_sh; (void)q_st;
    (void)k_sg; (void)k_ss; (void)v_sg; (void)v_ss; (void)o_st; (void)o_sh; (void)scale; (void)threads;
    return -2;
}
#endif

/* Decode steps (contract at the top). Returns 0, or -1 when scratch memory could not be
   allocated (out is then undefined). The AVX-512 path runs where the CPU has it and the head
   sizes are multiples of 16 up to 256, unless `portable`; the portable path otherwise. */
int ld_attend(const float* q, const void* k, const void* v, const uint8_t* mask, float* out,
              int64_t B, int64_t G, int64_t R, int64_t D, int64_t Dv, int64_t Tq, int64_t L,
              int64_t k_sb, int64_t k_sg, int64_t k_ss, int64_t v_sb, int64_t v_sg, int64_t v_ss,
              int kv_bf16, float scale, int threads, int portable) {
    const int64_t esz = kv_bf16 ? 2 : 4;
#ifdef LD_DECODE_FAST
    const int fast = !portable && ld_fast_path() && D % 16 == 0 && Dv % 16 == 0 && D <= 256 && Dv <= 256;
#endif
    int failed = 0;
#pragma omp parallel num_threads(threads) reduction(| : failed)
    {
        /* per thread: scores [R, L] and the scaled queries [R, max(D, R)] */
        float* scores = (float*)malloc(sizeof(float) * (size_t)(R * (L > 0 ? L : 1)));
        float* qs = (float*)malloc(sizeof(float) * (size_t)(R * (D > R ? D : R)));
        if (!scores || !qs) failed = 1;
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < B * G; ++task) {
            if (!scores || !qs) continue;
            const int64_t b = task / G, g = task % G;
            const uint8_t* m = mask + b * Tq * L;
            const int64_t n = visible_span(m, Tq, L);
            const char* kb = (const char*)k + (b * k_sb + g * k_sg) * esz;
            const char* vb = (const char*)v + (b * v_sb + g * v_sg) * esz;
            const float* qt = q + task * R * D;
            float* ot = out + task * R * Dv;
#ifdef LD_DECODE_FAST
            if (fast) {
                attend_one(qt, kb, vb, k_ss, v_ss, kv_bf16, m, ot, R, D, Dv, Tq, L, n, scale, scores, qs);
                continue;
            }
#endif
            (void)portable;
            attend_one_portable(qt, kb, vb, k_ss, v_ss, kv_bf16, m, ot, R, D, Dv, Tq, L, n, scale, scores);
        }
        free(scores);
        free(qs);
    }
    return failed ? -1 : 0;
}
