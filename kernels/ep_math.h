// Element arithmetic shared by the MORI-EP kernels (ep_intranode.cu, ep_internode.h): bf16 to
// and from f32, and the product that is never fused into an FMA. The host reference
// (mori-ep's combine) multiplies and adds separately and rounds to bf16 to nearest even, so
// these keep a GPU combine bit-exact against it.
#pragma once
#include "mori_gpu.h"

// The bf16 in the low 16 bits of `bits16`, widened to f32 (exact).
MORI_DEVICE float mori_bf16_to_f32(uint32_t bits16) { return __builtin_bit_cast(float, bits16 << 16); }

// f32 to bf16 (in the low 16 bits), rounded to nearest even; NaN stays NaN (quiet).
MORI_DEVICE uint32_t mori_f32_to_bf16(float f) {
    uint32_t u = __builtin_bit_cast(uint32_t, f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40; // NaN stays NaN
    u += 0x7fffu + ((u >> 16) & 1);                                // round to nearest even
    return u >> 16;
}

// a * b rounded on its own, never fused with a following add into an FMA: the host reference
// multiplies and adds separately, so a fused product would round differently.
MORI_DEVICE float mori_mul_rn(float a, float b) {
#if defined(__CUDACC__)
    return __fmul_rn(a, b);
#else
#if defined(__clang__)
#pragma clang fp contract(off)
#endif
    return a * b;
#endif
}
