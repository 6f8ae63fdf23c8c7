/* AVX-512 helpers shared by the decoding stages' C kernels (cpu_attention.c, cpu_fused.c).
   native.py hashes this header with each source, so a change here rebuilds both. */
#ifndef LD_CPU_SIMD_H
#define LD_CPU_SIMD_H
#include <stdint.h>
#ifdef __AVX512F__
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
#endif
#endif
