/* Elementwise work of the CPU forward in one pass each: RMSNorm (ld_rms_norm), the gated
   MLP's SiLU(gate) * up (ld_silu_mul) and rotary position embedding (ld_rope);
   stages/decoding/cpu_fused.py builds and calls them.

   Why: transformers computes RMSNorm as five tensor ops (pow, mean, add, rsqrt, two muls)
   and the MLP's activation as two (silu, mul), each a pass over activations of megabytes
   with its own OpenMP region. One 1,060-token prefill of the embedded model runs 61 norms
   over [1060, 576] and 30 activations over [1060, 1536]: on the 2-core Xeon (2026-11-27,
   two threads, isolated) a norm took 0.50 ms and an activation 0.94 ms; these kernels
   0.12 ms and 0.48 ms.

   Contracts (row-major float32):
   ld_rms_norm: x [rows, dim] with row stride ldx, w [dim], out [rows, dim] contiguous:
       out[i, j] = w[j] * (x[i, j] * r_i), r_i = 1 / sqrt(mean_j x[i, j]^2 + eps), the
       transformers formula with its order of the two products; the sum of squares in
       another order than torch's mean (equal within float32 rounding).
   ld_silu_mul: g, u, out [n] contiguous: out = g / (1 + e^-g) * u, with e^-|g| from the
       shared exp (cpu_simd.h, ~2 ulp), so never an overflowing exponential.
   ld_rope: x [B, H, T, D] by element strides (sb, sh, st; the last axis unit stride), cos and
       sin [B, T, D] by strides (cb, ct), out [B, T, H, D] contiguous (transformers' own
       result layout for its transposed query/key views): with h = D / 2,
       out[.., j] = x[j] * cos[j] - x[j + h] * sin[j] for j < h and
       out[.., j] = x[j] * cos[j] + x[j - h] * sin[j] for j >= h: transformers'
       ``q * cos + rotate_half(q) * sin`` with its roundings (each product rounded, then
       the sum; the explicitly rounded intrinsics keep the compiler from contracting them
       into an FMA), so equal bit for bit. D even.
   All return 0, or -2 where the library was built without AVX-512 (ld_fast_path() == 0).
*/
#include <math.h>
#include <stdint.h>
#include "cpu_simd.h"

#define BLOCK 4096 /* elements per OpenMP task of ld_silu_mul (16 KB of each input) */
#define ROPE_PARALLEL 32768 /* elements of x below which ld_rope runs on one thread (a decode step's few rows) */
#define RN (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

int ld_fast_path(void) {
#ifdef __AVX512F__
    return 1;
#else
    return 0;
#endif
}

#ifdef __AVX512F__
int ld_rms_norm(const float* x, int64_t rows, int64_t dim, int64_t ldx, const float* w, float eps, float* out,
                int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t i = 0; i < rows; i++) {
        const float* xi = x + i * ldx;
        float* oi = out + i * dim;
        __m512 acc = _mm512_setzero_ps();
        for (int64_t j = 0; j < dim; j += 16) {
            __m512 v = _mm512_maskz_loadu_ps(lanes_below(dim, j), xi + j);
            acc = _mm512_fmadd_ps(v, v, acc);
        }
        float r = 1.0f / sqrtf(_mm512_reduce_add_ps(acc) / (float)dim + eps);
        __m512 rv = _mm512_set1_ps(r);
        for (int64_t j = 0; j < dim; j += 16) {
            __mmask16 m = lanes_below(dim, j);
            __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, xi + j), rv);
            _mm512_mask_storeu_ps(oi + j, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, w + j), v));
        }
    }
    return 0;
}

int ld_silu_mul(const float* g, const float* u, float* out, int64_t n, int threads) {
    const __m512 one = _mm512_set1_ps(1.0f), zero = _mm512_setzero_ps();
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t b = 0; b < (n + BLOCK - 1) / BLOCK; b++) {
        int64_t end = (b + 1) * BLOCK < n ? (b + 1) * BLOCK : n;
        for (int64_t j = b * BLOCK; j < end; j += 16) {
            __mmask16 m = lanes_below(end, j);
            __m512 x = _mm512_maskz_loadu_ps(m, g + j);
            __m512 e = exp_nonpositive(_mm512_sub_ps(zero, _mm512_abs_ps(x))); /* e^-|x| */
            /* silu(x) = x / (1 + e^-x): for x < 0 written x e^x / (1 + e^x), the same value */
            __m512 num = _mm512_mask_mul_ps(x, _mm512_cmp_ps_mask(x, zero, _CMP_LT_OQ), x, e);
            __m512 s = _mm512_div_ps(num, _mm512_add_ps(one, e));
            _mm512_mask_storeu_ps(out + j, m, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(m, u + j)));
        }
    }
    return 0;
}

int ld_rope(const float* x, int64_t B, int64_t H, int64_t T, int64_t D, int64_t sb, int64_t sh, int64_t st,
            const float* cos, const float* sin, int64_t cb, int64_t ct, float* out, int threads) {
    const int64_t half = D / 2;
#pragma omp parallel for collapse(2) schedule(static) num_threads(threads) if (B * H * T * D >= ROPE_PARALLEL)
    for (int64_t b = 0; b < B; b++) {
        for (int64_t t = 0; t < T; t++) {
            const float* c = cos + b * cb + t * ct;
            const float* s = sin + b * cb + t * ct;
            for (int64_t h = 0; h < H; h++) {
                const float* xr = x + b * sb + h * sh + t * st;
                float* o = out + ((b * T + t) * H + h) * D;
                for (int64_t j = 0; j < half; j += 16) {
                    __mmask16 m = lanes_below(half, j);
                    __m512 x1 = _mm512_maskz_loadu_ps(m, xr + j), x2 = _mm512_maskz_loadu_ps(m, xr + half + j);
                    __m512 c1 = _mm512_maskz_loadu_ps(m, c + j), c2 = _mm512_maskz_loadu_ps(m, c + half + j);
                    __m512 s1 = _mm512_maskz_loadu_ps(m, s + j), s2 = _mm512_maskz_loadu_ps(m, s + half + j);
                    __m512 lo = _mm512_sub_round_ps(_mm512_mul_round_ps(x1, c1, RN), _mm512_mul_round_ps(x2, s1, RN), RN);
                    __m512 hi = _mm512_add_round_ps(_mm512_mul_round_ps(x2, c2, RN), _mm512_mul_round_ps(x1, s2, RN), RN);
                    _mm512_mask_storeu_ps(o + j, m, lo);
                    _mm512_mask_storeu_ps(o + half + j, m, hi);
                }
            }
        }
    }
    return 0;
}
#else
/* Without AVX-512 the caller never asks (ld_fast_path() is 0). */
int ld_rms_norm(const float* x, int64_t rows, int64_t dim, int64_t ldx, const float* w, float eps, float* out,
                int threads) {
    (void)x; (void)rows; (void)dim; (void)ldx; (void)w; (void)eps; (void)out; (void)threads;
    return -2;
}
int ld_silu_mul(const float* g, const float* u, float* out, int64_t n, int threads) {
    (void)g; (void)u; (void)out; (void)n; (void)threads;
    return -2;
}
int ld_rope(const float* x, int64_t B, int64_t H, int64_t T, int64_t D, int64_t sb, int64_t sh, int64_t st,
            const float* cos, const float* sin, int64_t cb, int64_t ct, float* out, int threads) {
    (void)x; (void)B; (void)H; (void)T; (void)D; (void)sb; (void)sh; (void)st;
    (void)cos; (void)sin; (void)cb; (void)ct; (void)out; (void)threads;
    return -2;
}
#endif
