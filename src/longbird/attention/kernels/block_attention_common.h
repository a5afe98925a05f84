// What the AVX-512 block attention kernels share (block_attention_bf16.cpp, block_attention_fp32.cpp): the
// exponential, LittleBird's BiALiBi distance and the score epilogue, in AVX-512 vectors; the per-thread group
// buffers, which every kernel uses, AVX2 included, are in block_attention_groups.h.
#pragma once
#include <immintrin.h>

#include "block_attention_groups.h"

// e^x for x <= 0, -inf -> 0: Cephes expf's range reduction (x = n ln2 + r, |r| <= ln2/2), 2^n applied with scalef.
// DEGREE 6: Cephes' polynomial for e^r (relative error about 1e-7, fp32's own rounding), for the fp32 kernel.
// DEGREE 4: e^r's Taylor polynomial of degree 4 (relative error at most 5.6e-5 on that range), for the bf16 kernel,
// whose probabilities are rounded to bf16 right after (relative error up to 2^-8 = 3.9e-3), so a longer polynomial
// would buy nothing there: one layer at 4K ran 7 % faster than with degree 6 (alternating builds in one process).
template <int DEGREE>
static inline __m512 exp_nonpositive(__m512 x) {
    const __mmask16 underflow = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_LT_OQ);
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p;
    if constexpr (DEGREE == 4) {
        p = _mm512_set1_ps(1.0f / 24.0f);
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    } else {
        static_assert(DEGREE == 6, "exp_nonpositive: degree 4 or 6");
        p = _mm512_set1_ps(1.9875691500e-4f);
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    }
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_maskz_mov_ps(static_cast<__mmask16>(~underflow), _mm512_scalef_ps(p, n));
}

// One 32-bit word copied by memcpy: the words are fp32 values or bf16 pairs, which C++ does not let a uint32_t
// pointer read (strict aliasing); the compiler makes it one load and one store.
static inline void copy_word(uint32_t *dst, const uint32_t *src) { memcpy(dst, src, 4); }

// dst[c * dst_stride + r] = src[r * src_stride + c] for r < rows, c < cols, on 32-bit words (an fp32 value or a pair
// of bf16 values): the key transpose of the pack functions. Tiles of 16 x 16 words are transposed in registers
// (unpack 32-bit, unpack 64-bit, two 128-bit lane shuffles), so each row is read and each column written as whole
// vectors; the word-by-word loop it replaced stored one word at a time, each a block's row length away from the
// last, and packing took 2.2-3.0 times as long as copying the same keys and values, against 1.3-1.9 since
// (benchmarks/pack_blocks.py; docs/benchmarks.md, "The key transpose in registers").
// Rows and columns past the last whole tile are copied one word at a time.
static inline void transpose_words(const uint32_t *src, int64_t src_stride, int64_t rows, int64_t cols,
                                   uint32_t *dst, int64_t dst_stride) {
    int64_t r0 = 0;
    for (; r0 + 16 <= rows; r0 += 16) {
        int64_t c0 = 0;
        for (; c0 + 16 <= cols; c0 += 16) {
            __m512i r[16], t[16];
            for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_si512(src + (r0 + i) * src_stride + c0);
            for (int i = 0; i < 16; i += 2) {
                t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
                t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
            }
            for (int i = 0; i < 16; i += 4) {
                r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
                r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
                r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
                r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
            }
            for (int i = 0; i < 4; i++) {
                t[i] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0x88);
                t[i + 4] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0xdd);
                t[i + 8] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0x88);
                t[i + 12] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0xdd);
            }
            for (int i = 0; i < 8; i++) {
                r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
                r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
            }
            for (int i = 0; i < 16; i++) _mm512_storeu_si512(dst + (c0 + i) * dst_stride + r0, r[i]);
        }
        for (; c0 < cols; c0++)
            for (int i = 0; i < 16; i++) copy_word(dst + c0 * dst_stride + r0 + i, src + (r0 + i) * src_stride + c0);
    }
    for (; r0 < rows; r0++)
        for (int64_t c = 0; c < cols; c++) copy_word(dst + c * dst_stride + r0, src + r0 * src_stride + c);
}

// LittleBird's BiALiBi distance D (LittleBird §3.1, §3.3; positions/alibi.py) of one query position to 16 keys, for
// the group's head slopes [α, β, γ, D_C]: 0 at the same position, α where either position is 0 ([CLS]), β·(p_i − p_j)
// for a key on the left, γ·(p_j − p_i) on the right; a packed-context key gets D_C whatever its position.
static inline __m512 bialibi_distance(float query_position, const float *slopes, const float *key_position,
                                      const float *key_is_pack) {
    const __m512 pj = _mm512_loadu_ps(key_position);
    const __m512 delta = _mm512_sub_ps(_mm512_set1_ps(query_position), pj);
    const __m512 zero = _mm512_setzero_ps();
    __m512 d = _mm512_add_ps(_mm512_mul_ps(_mm512_max_ps(delta, zero), _mm512_set1_ps(slopes[1])),
                             _mm512_mul_ps(_mm512_max_ps(_mm512_sub_ps(zero, delta), zero), _mm512_set1_ps(slopes[2])));
    const __mmask16 moved = _mm512_cmp_ps_mask(delta, zero, _CMP_NEQ_OQ);
    const __mmask16 at_cls = query_position == 0.0f ? static_cast<__mmask16>(0xFFFF)
                                                    : _mm512_cmp_ps_mask(pj, zero, _CMP_EQ_OQ);
    d = _mm512_mask_mov_ps(d, moved & at_cls, _mm512_set1_ps(slopes[0]));
    const __mmask16 pack = _mm512_cmp_ps_mask(_mm512_loadu_ps(key_is_pack), zero, _CMP_NEQ_OQ);
    return _mm512_mask_mov_ps(d, pack, _mm512_set1_ps(slopes[3]));
}

// Four query rows' scores of keys j..j+31 from their dot products (raw[r][0]: keys j..j+15, raw[r][1]: the next 16):
// scaled, the additive mask added, BiALiBi's distance subtracted (slopes != nullptr: the group's [α, β, γ, D_C]),
// stored in the scratch's scores (rows `padded` apart), and each row's running maximum kept in `top`.
__attribute__((always_inline)) static inline void finish_scores(
    const __m512 raw[4][2], int64_t j, __m512 scale, const GroupScratch &scratch, const float *slopes,
    const float query_position[4], int64_t padded, __m512 top[4]) {
    const __m512 bias0 = _mm512_loadu_ps(scratch.bias + j), bias1 = _mm512_loadu_ps(scratch.bias + j + 16);
    for (int r = 0; r < 4; r++) {
        __m512 lo = _mm512_fmadd_ps(raw[r][0], scale, bias0);
        __m512 hi = _mm512_fmadd_ps(raw[r][1], scale, bias1);
        if (slopes) {
            lo = _mm512_sub_ps(lo, bialibi_distance(query_position[r], slopes, scratch.key_position + j,
                                                    scratch.key_is_pack + j));
            hi = _mm512_sub_ps(hi, bialibi_distance(query_position[r], slopes, scratch.key_position + j + 16,
                                                    scratch.key_is_pack + j + 16));
        }
        _mm512_storeu_ps(scratch.scores + r * padded + j, lo);
        _mm512_storeu_ps(scratch.scores + r * padded + j + 16, hi);
        top[r] = _mm512_max_ps(top[r], _mm512_max_ps(lo, hi));
    }
}
