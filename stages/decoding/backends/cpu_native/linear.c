/* Linear layers of CPU decode steps: y = x W^T for a few dozen token rows, from a weight
   packed once (ld_pack_weight) into panels the kernel streams (ld_linear_packed);
   linear.py builds and calls them, linear_plan.py routes the token counts where they win.

   Why a kernel of our own: a decode step feeds M = rows x width tokens (tens) through every
   linear layer. The BLAS repacks the weight on every call and runs kernels shaped for large
   M, so at these sizes it reaches a fraction of the CPU's arithmetic rate. Packed once, each
   weight is read from memory once per call while the FMA units work on rows already loaded.
   Whether that pays is a property of the CPU: it saved 8% of the sample night on an AMD
   EPYC (Zen 5) and 3% on an Intel Xeon (jobs/results/cpu-kernels/README.md), so the plan
   probes it on each machine and routes only the token counts it wins.

   Portability: one binary for every x86-64 CPU, as attention.c: the AVX-512 path is compiled
   by the target pragma below and runs only where the CPU reports AVX-512 F at run time
   (ld_fast_path); ld_linear_packed_portable is the same contract in plain C (the reference
   the tests hold the fast path to, on every machine).

   Layout: Wp [P, K, 32] float32 with P = ceil(N / 32): panel p holds output columns
   32p .. 32p+31, for each k the 32 weights W[32p + j, k] side by side (zero past N).

   Contract of both entry points (row-major float32):
   x   [M, K] with row stride ldx (elements), K contiguous.
   wp  the packed weight of an [N, K] matrix.
   y   [M, N] with row stride ldy: y[m, n] = sum over k of x[m, k] * W[n, k], summed in
       k order (another order than a BLAS: equal within float32 rounding, not bit for bit).
   threads: OpenMP threads, each taking whole panels (each weight byte is read by one).
   Returns 0, or -2 where the fast path is not compiled in. */
#include <stdint.h>
#include <string.h>

#define PANEL 32 /* output columns per panel: two 16-float vectors */

void ld_pack_weight(const float* w, int64_t N, int64_t K, int64_t ldw, float* wp, int threads) {
    int64_t panels = (N + PANEL - 1) / PANEL;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t p = 0; p < panels; p++) {
        float* dst = wp + p * K * PANEL;
        int64_t n0 = p * PANEL, nn = N - n0 < PANEL ? N - n0 : PANEL;
        for (int64_t k = 0; k < K; k++)
            for (int64_t j = 0; j < PANEL; j++) dst[k * PANEL + j] = j < nn ? w[(n0 + j) * ldw + k] : 0.0f;
    }
}

/* Portable path: per panel, per row, the 32 outputs accumulated over k in k order. */
int ld_linear_packed_portable(const float* x, int64_t M, int64_t K, int64_t ldx, const float* wp, int64_t N,
                              float* y, int64_t ldy, int threads) {
    int64_t panels = (N + PANEL - 1) / PANEL;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t p = 0; p < panels; p++) {
        int64_t n0 = p * PANEL, nn = N - n0 < PANEL ? N - n0 : PANEL;
        const float* w = wp + p * K * PANEL;
        for (int64_t m = 0; m < M; m++) {
            float acc[PANEL];
            memset(acc, 0, sizeof acc);
            for (int64_t k = 0; k < K; k++) {
                float b = x[m * ldx + k];
                for (int64_t j = 0; j < PANEL; j++) acc[j] += b * w[k * PANEL + j];
            }
            memcpy(y + m * ldy + n0, acc, (size_t)nn * sizeof(float));
        }
    }
    return 0;
}

#if defined(__x86_64__) && defined(__GNUC__)
/* Whether this CPU runs the AVX-512 path. */
int ld_fast_path(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f");
}

#pragma GCC push_options
#pragma GCC target("avx512f,fma")
#include <immintrin.h>

#define MAX_TILE 12 /* rows per register tile: 2 x 12 accumulators + 2 weights + 1 broadcast <= 32 zmm */
/* How far ahead a tile's loop prefetches its panel into L1, in k-steps (the sweep behind it:
   jobs/results/code-choices.md, "stages/decoding/backends/cpu_native/linear.c"). */
#define AHEAD 8

/* One register tile: rows x 32 outputs over all of K. `rows` is a compile-time constant at
   every call (the switch below), so the accumulators stay in registers. While a panel's
   later tiles run from cache, they prefetch the next panel into L2, each tile its own share
   of it (k-steps base + k / tiles): the memory reads then overlap the arithmetic instead of
   stalling the panel's first tile. */
static inline __attribute__((always_inline)) void tile(const float* x, int64_t ldx, const float* w, int64_t K,
                                                       float* y, int64_t ldy, __mmask16 lo, __mmask16 hi,
                                                       const float* next, int64_t next_base, int64_t next_step,
                                                       const int rows) {
    __m512 a0[MAX_TILE], a1[MAX_TILE];
    for (int r = 0; r < rows; r++) { a0[r] = _mm512_setzero_ps(); a1[r] = _mm512_setzero_ps(); }
    for (int64_t k = 0; k < K; k++) {
        __m512 w0 = _mm512_loadu_ps(w + k * PANEL), w1 = _mm512_loadu_ps(w + k * PANEL + 16);
        _mm_prefetch((const char*)(w + (k + AHEAD) * PANEL), _MM_HINT_T0);
        _mm_prefetch((const char*)(w + (k + AHEAD) * PANEL + 16), _MM_HINT_T0);
        if (next) {
            const float* n = next + (next_base + ((k * next_step) >> 16)) * PANEL;
            _mm_prefetch((const char*)n, _MM_HINT_T1);
            _mm_prefetch((const char*)(n + 16), _MM_HINT_T1);
        }
        for (int r = 0; r < rows; r++) {
            __m512 b = _mm512_set1_ps(x[r * ldx + k]);
            a0[r] = _mm512_fmadd_ps(b, w0, a0[r]);
            a1[r] = _mm512_fmadd_ps(b, w1, a1[r]);
        }
    }
    for (int r = 0; r < rows; r++) {
        _mm512_mask_storeu_ps(y + r * ldy, lo, a0[r]);
        _mm512_mask_storeu_ps(y + r * ldy + 16, hi, a1[r]);
    }
}

static inline __mmask16 first_lanes(int64_t n) { return n >= 16 ? (__mmask16)0xFFFF : n <= 0 ? 0 : (__mmask16)((1u << n) - 1); }

int ld_linear_packed(const float* x, int64_t M, int64_t K, int64_t ldx, const float* wp, int64_t N,
                     float* y, int64_t ldy, int threads) {
    int64_t panels = (N + PANEL - 1) / PANEL;
    /* Rows split evenly over the fewest tiles (39 -> 10, 10, 10, 9): a thin last tile would
       run its FMAs at the rate of its two weight loads. */
    int64_t tiles = (M + MAX_TILE - 1) / MAX_TILE;
    int64_t rows = (M + tiles - 1) / tiles;
    int64_t next_step = 65536 / tiles; /* k / tiles in 16.16 fixed point */
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t p = 0; p < panels; p++) {
        int64_t n0 = p * PANEL, nn = N - n0 < PANEL ? N - n0 : PANEL;
        __mmask16 lo = first_lanes(nn), hi = first_lanes(nn - 16);
        const float* w = wp + p * K * PANEL;
        /* static schedule: a thread's panels are consecutive, so p + 1 is usually its next */
        const float* next = (p + 1 < panels && tiles > 1) ? w + K * PANEL : NULL;
        for (int64_t t = 0; t < tiles; t++) {
            int64_t m = t * rows, r = M - m < rows ? M - m : rows;
            const float* xm = x + m * ldx;
            float* ym = y + m * ldy + n0;
            int64_t base = t * K / tiles;
            switch (r) {
#define TILE(R) case R: tile(xm, ldx, w, K, ym, ldy, lo, hi, next, base, next_step, R); break;
                TILE(1) TILE(2) TILE(3) TILE(4) TILE(5) TILE(6) TILE(7) TILE(8) TILE(9) TILE(10) TILE(11) TILE(12)
#undef TILE
            }
        }
    }
    return 0;
}
#pragma GCC pop_options
#else
int ld_fast_path(void) { return 0; }

int ld_linear_packed(const float* x, int64_t M, int64_t K, int64_t ldx, const float* wp, int64_t N,
                     float* y, int64_t ldy, int threads) {
    (void)x; (void)M; (void)K; (void)ldx; (void)wp; (void)N; (void)y; (void)ldy; (void)threads;
    return -2;
}
#endif
