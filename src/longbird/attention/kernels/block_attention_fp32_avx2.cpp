// Fused block attention for fp32 on CPUs with AVX2 and FMA but no AVX-512 (longbird.attention.cpu_kernel builds it
// into a library of its own, with -mavx2 -mfma only, and loads it where the CPU has no AVX-512).
//
// Why: on such a CPU (a 2-core AMD EPYC, Zen 2) an fp32 kobigbird e5-small forward at 4K spent 29 % of its time in
// PyTorch's CPU flash kernel and a further 4 % gathering key blocks (index_select), LittleBird's 32 % in compiled
// flex attention (docs/benchmarks.md, "The fused kernel on AVX2 CPUs"). The same groups, offset tables, masks, packed blocks and BiALiBi distance as the
// AVX-512 kernels (block_attention_bf16.cpp's header comment defines the arguments), the same arithmetic as the
// AVX-512 fp32 kernel (block_attention_fp32.cpp) in 8-wide vectors:
//   scores  s = scale * q . k          fp32 products summed in fp32 (FMA), 16 keys x 4 query rows at a time
//   softmax p = exp(s - max) / sum     exp to about 1e-7 (Cephes' degree-6 polynomial); masked keys exactly 0
//   output  o = sum_j p_j v_j          fp32, 16 value columns x 4 query rows at a time; a group with no allowed key
//                                      outputs 0
// AVX2 has 16 vector registers (AVX-512: 32), so each step holds 8 accumulators: scores take 16 keys per pass
// instead of 32, and the weighted values 16 columns per pass over the keys instead of all of them.
// Needs d <= 128 and dv % 16 == 0, dv <= 64 (the caller checks and otherwise takes SDPA); returns 1 outside that
// range, 2 if out of memory. packed != 0: k and v are this library's longbird_pack_blocks_fp32's output (kb a multiple
// of 32), in this kernel's own layout (key_chunk, value_run below) but with the AVX-512 fp32 kernel's block sizes.
// The two functions have the AVX-512 fp32 library's names and arguments; a process loads one of the two libraries.
#include <immintrin.h>

#include "block_attention_groups.h"

// Query rows taken at a time, as in the AVX-512 kernels (GroupScratch holds their scores): 8 accumulators beside two
// key (or value) vectors and a broadcast. Six rows (12 accumulators, 15 of the 16 registers) ran no faster on a
// 2-core AMD EPYC (Zen 2): one BigBird layer at 4K, 12 heads of 32, 92.5 against 94.6 ms (medians of 9, alternating;
// the machine's noise is larger).
constexpr int ROWS = 4;

// e^x for x <= 0, -inf -> 0, as the AVX-512 kernels' exp_nonpositive<6> (block_attention_common.h): Cephes expf's
// range reduction x = n ln2 + r (|r| <= ln2/2) and polynomial for e^r; AVX2 has no scalef, so 2^n is built in the
// exponent bits. x is clamped at -87 first (below it the result is 0), so n >= -126 and 2^n is a normal float.
static inline __m256 exp_nonpositive_avx2(__m256 x) {
    const __m256 underflow = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_LT_OQ);
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i exponent = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(underflow, _mm256_mul_ps(p, _mm256_castsi256_ps(exponent)));
}

// LittleBird's BiALiBi distance (LittleBird §3.1, §3.3) of one query position to 8 keys, as bialibi_distance in
// block_attention_common.h: 0 at the same position, α where either position is 0 ([CLS]), β·(p_i − p_j) for a key on
// the left, γ·(p_j − p_i) on the right, D_C for a packed-context key.
static inline __m256 bialibi_distance_avx2(float query_position, const float *slopes, const float *key_position,
                                           const float *key_is_pack) {
    const __m256 pj = _mm256_loadu_ps(key_position);
    const __m256 delta = _mm256_sub_ps(_mm256_set1_ps(query_position), pj);
    const __m256 zero = _mm256_setzero_ps();
    __m256 d = _mm256_add_ps(_mm256_mul_ps(_mm256_max_ps(delta, zero), _mm256_set1_ps(slopes[1])),
                             _mm256_mul_ps(_mm256_max_ps(_mm256_sub_ps(zero, delta), zero), _mm256_set1_ps(slopes[2])));
    const __m256 moved = _mm256_cmp_ps(delta, zero, _CMP_NEQ_OQ);
    const __m256 at_cls = query_position == 0.0f ? _mm256_castsi256_ps(_mm256_set1_epi32(-1))
                                                 : _mm256_cmp_ps(pj, zero, _CMP_EQ_OQ);
    d = _mm256_blendv_ps(d, _mm256_set1_ps(slopes[0]), _mm256_and_ps(moved, at_cls));
    const __m256 pack = _mm256_cmp_ps(_mm256_loadu_ps(key_is_pack), zero, _CMP_NEQ_OQ);
    return _mm256_blendv_ps(d, _mm256_set1_ps(slopes[3]), pack);
}

// The layout this kernel reads keys and values in, per block of `rows` keys (a packed call's blocks, or one group's
// keys copied into a thread's buffer): keys as (rows/16, d, 16), each chunk of 16 keys with all its d features in one
// run of 16·d floats; values as (dv/16, rows, 16), each 16 columns of every key in one run. So each pass over the
// keys reads one sequential stream instead of d rows (or dv/16 column runs) 4·rows bytes apart, and the copy needs no
// padded buffer rows (the AVX-512 kernels' transposed (d, rows) keys needed rows 16 floats longer against L1 set
// conflicts). Measured on a 2-core AMD EPYC (Zen 2), one BigBird layer at 4K (12 heads of 32), against the (d, rows)
// layout: medians 80.3 / 83.3 and 87.7 / 90.1 ms in two runs of 9 alternating calls: within this machine's noise, no
// slower. These return a block's key / value float offsets.
static inline int64_t key_chunk(int64_t key, int64_t d) { return key / 16 * 16 * d + key % 16; }
static inline int64_t value_run(int64_t key, int64_t column, int64_t rows) {
    return column / 16 * 16 * rows + key * 16 + column % 16;
}

// Key `key` (its d features at krow, or zeros for nullptr) and its values (dv at vrow, or zeros) into a block of
// `rows` keys of this kernel's layout at key_block / value_block.
static inline void copy_key(const float *krow, const float *vrow, int64_t key, int64_t rows, int64_t d, int64_t dv,
                            float *key_block, float *value_block) {
    float *kd = key_block + key_chunk(key, d);
    for (int64_t c = 0; c < d; c++) kd[16 * c] = krow ? krow[c] : 0.0f;
    for (int64_t c = 0; c < dv; c += 16) {
        float *vd = value_block + value_run(key, c, rows);
        if (vrow) memcpy(vd, vrow + c, 64);
        else memset(vd, 0, 64);
    }
}

// One query group's keys and values in this kernel's layout, with the per-thread buffers they need: a packed call's
// blocks read in place (longbird_pack_blocks_fp32's output), otherwise the group's keys and values copied into one
// block of `padded` rows whose slots past Lk are zero. The compute loops walk `blocks` blocks of `block_keys` keys.
struct GroupKeys {
    const bool packed;
    const int64_t d, dv, nkb, kb, Lk, padded, blocks, block_keys;
    float *key_rows = nullptr, *value_rows = nullptr;
    const float **key_base, **value_base;
    GroupKeys(bool packed, int64_t d, int64_t dv, int64_t nkb, int64_t kb, int64_t padded)
        : packed(packed), d(d), dv(dv), nkb(nkb), kb(kb), Lk(nkb * kb), padded(padded), blocks(packed ? nkb : 1),
          block_keys(packed ? kb : padded),
          key_base(static_cast<const float **>(malloc(sizeof(void *) * blocks))),
          value_base(static_cast<const float **>(malloc(sizeof(void *) * blocks))) {
        if (!packed) {
            key_rows = static_cast<float *>(aligned_alloc(64, 4 * d * padded + 64));
            value_rows = static_cast<float *>(aligned_alloc(64, 4 * padded * dv + 64));
        }
    }
    GroupKeys(const GroupKeys &) = delete;
    GroupKeys &operator=(const GroupKeys &) = delete;
    ~GroupKeys() {
        free(key_rows);
        free(value_rows);
        free(key_base);
        free(value_base);
    }
    bool allocated() const { return key_base && value_base && (packed || (key_rows && value_rows)); }

    // Point at (packed) or copy (otherwise) group g's key and value blocks.
    void gather(const float *k, const int64_t *k_off, int64_t k_row_stride, const float *v, const int64_t *v_off,
                int64_t v_row_stride, int64_t g) {
        if (packed) {
            for (int64_t t = 0; t < nkb; t++) {
                key_base[t] = k + k_off[g * nkb + t];
                value_base[t] = v + v_off[g * nkb + t];
            }
            return;
        }
        for (int64_t j = 0; j < padded; j++) {
            const float *krow = j < Lk ? k + k_off[g * nkb + j / kb] + (j % kb) * k_row_stride : nullptr;
            const float *vrow = j < Lk ? v + v_off[g * nkb + j / kb] + (j % kb) * v_row_stride : nullptr;
            copy_key(krow, vrow, j, padded, d, dv, key_rows, value_rows);
        }
        key_base[0] = key_rows;
        value_base[0] = value_rows;
    }
};

static inline float horizontal_max(__m256 x) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

static inline float horizontal_sum(__m256 x) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

// ROWS query rows' scores of keys j..j+15 from their dot products (raw[r][0]: keys j..j+7, raw[r][1]: the next 8):
// scaled, the additive mask added, BiALiBi's distance subtracted (slopes != nullptr), stored in the scratch's scores
// (rows `padded` apart), and each row's running maximum kept in `top`. As finish_scores in block_attention_common.h.
__attribute__((always_inline)) static inline void finish_scores_avx2(
    const __m256 raw[ROWS][2], int64_t j, __m256 scale, const GroupScratch &scratch, const float *slopes,
    const float query_position[ROWS], int64_t padded, __m256 top[ROWS]) {
    const __m256 bias0 = _mm256_loadu_ps(scratch.bias + j), bias1 = _mm256_loadu_ps(scratch.bias + j + 8);
    for (int r = 0; r < ROWS; r++) {
        __m256 lo = _mm256_fmadd_ps(raw[r][0], scale, bias0);
        __m256 hi = _mm256_fmadd_ps(raw[r][1], scale, bias1);
        if (slopes) {
            lo = _mm256_sub_ps(lo, bialibi_distance_avx2(query_position[r], slopes, scratch.key_position + j,
                                                         scratch.key_is_pack + j));
            hi = _mm256_sub_ps(hi, bialibi_distance_avx2(query_position[r], slopes, scratch.key_position + j + 8,
                                                         scratch.key_is_pack + j + 8));
        }
        _mm256_storeu_ps(scratch.scores + r * padded + j, lo);
        _mm256_storeu_ps(scratch.scores + r * padded + j + 8, hi);
        top[r] = _mm256_max_ps(top[r], _mm256_max_ps(lo, hi));
    }
}

// ROWS query rows' unnormalised scores of one chunk of 16 keys (`keys`: its 16·d floats, feature-major) into
// raw[r][0..1]: d FMAs per key and row, 2·ROWS independent sums.
__attribute__((always_inline)) static inline void dot_products(const float *keys, int64_t d,
                                                               const float *const qrow[ROWS], __m256 raw[ROWS][2]) {
    __m256 a[ROWS][2];
    for (int r = 0; r < ROWS; r++) a[r][0] = a[r][1] = _mm256_setzero_ps();
    for (int64_t c = 0; c < d; c++) {
        const __m256 k0 = _mm256_loadu_ps(keys + 16 * c);
        const __m256 k1 = _mm256_loadu_ps(keys + 16 * c + 8);
        for (int r = 0; r < ROWS; r++) {
            const __m256 x = _mm256_broadcast_ss(qrow[r] + c);
            a[r][0] = _mm256_fmadd_ps(x, k0, a[r][0]);
            a[r][1] = _mm256_fmadd_ps(x, k1, a[r][1]);
        }
    }
    for (int r = 0; r < ROWS; r++) raw[r][0] = a[r][0], raw[r][1] = a[r][1];
}

// acc[r][0..1] = sum over keys of probs (row r, rows `stride` floats apart) times value columns col..col+15 (each
// block's run of them, value_run), for ROWS query rows; the blocks are walked in order so that no key index is
// divided.
__attribute__((always_inline)) static inline void weighted_values(const float *const *value_base, int64_t blocks,
                                                                  int64_t block_keys, int64_t dv, int64_t col,
                                                                  const float *probs, int64_t stride,
                                                                  __m256 acc[ROWS][2]) {
    __m256 a[ROWS][2];
    for (int r = 0; r < ROWS; r++) a[r][0] = a[r][1] = _mm256_setzero_ps();
    for (int64_t b = 0; b < blocks; b++) {
        const float *values = value_base[b] + value_run(0, col, block_keys);
        const float *p = probs + b * block_keys;
        for (int64_t j = 0; j < block_keys; j++, values += 16, p++) {
            const __m256 v0 = _mm256_loadu_ps(values), v1 = _mm256_loadu_ps(values + 8);
            for (int r = 0; r < ROWS; r++) {
                const __m256 w = _mm256_broadcast_ss(p + r * stride);
                a[r][0] = _mm256_fmadd_ps(w, v0, a[r][0]);
                a[r][1] = _mm256_fmadd_ps(w, v1, a[r][1]);
            }
        }
    }
    for (int r = 0; r < ROWS; r++) acc[r][0] = a[r][0], acc[r][1] = a[r][1];
}

extern "C" int longbird_block_attention_fp32(
    const float *q, const int64_t *q_off, int64_t q_row_stride, int64_t Lq,
    const float *k, const int64_t *k_off, int64_t k_row_stride,
    const float *v, const int64_t *v_off, int64_t v_row_stride,
    const uint8_t *mask, const int64_t *m_off,
    int64_t nkb, int64_t kb, int64_t d, int64_t dv,
    float *out, const int64_t *o_off, int64_t o_row_stride,
    int64_t G, float scale, int packed, int threads,
    const float *alibi, const int64_t *positions, const int64_t *qpos_off, const int64_t *kpos_off) {
    const int64_t Lk = nkb * kb, padded = (Lk + 31) / 32 * 32;
    if (Lk < 1 || d < 1 || d > 128 || dv % 16 != 0 || dv > 64 || (packed && kb % 32 != 0)) return 1;
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        // Per thread: the group's keys and values (packed blocks in place, or copied) and its mask, scores (then
        // probabilities) and key positions.
        GroupKeys group(packed, d, dv, nkb, kb, padded);
        GroupScratch scratch(padded, alibi != nullptr);
        if (!group.allocated() || !scratch.allocated(alibi != nullptr)) {
#pragma omp atomic write
            failed = 2;
        }
#pragma omp for schedule(static)
        for (int64_t g = 0; g < G; g++) {
            if (failed) continue;
            const int any = scratch.prepare(mask, m_off, g, nkb, kb, padded, positions, alibi ? kpos_off : nullptr);
            group.gather(k, k_off, k_row_stride, v, v_off, v_row_stride, g);
            const float *slopes = alibi ? alibi + 4 * g : nullptr;
            for (int64_t i0 = 0; i0 < Lq; i0 += ROWS) {
                const int64_t rows = Lq - i0 < ROWS ? Lq - i0 : ROWS;
                const float *qrow[ROWS];
                for (int r = 0; r < ROWS; r++) qrow[r] = q + q_off[g] + (i0 + (r < rows ? r : 0)) * q_row_stride;
                float query_position[ROWS];
                query_positions(alibi ? positions : nullptr, qpos_off, g, i0, rows, query_position);
                __m256 top[ROWS];
                for (int r = 0; r < ROWS; r++) top[r] = _mm256_set1_ps(-INFINITY);
                const __m256 vscale = _mm256_set1_ps(scale);
                for (int64_t j = 0; j < padded; j += 16) {
                    __m256 raw[ROWS][2];
                    dot_products(group.key_base[j / group.block_keys] + key_chunk(j % group.block_keys, d), d,
                                       qrow, raw);
                    finish_scores_avx2(raw, j, vscale, scratch, slopes, query_position, padded, top);
                }
                float inv[ROWS];
                for (int r = 0; r < ROWS; r++) {  // probabilities overwrite the scores
                    float m = horizontal_max(top[r]);
                    if (m == -INFINITY) m = 0.0f;
                    const __m256 vm = _mm256_set1_ps(m);
                    __m256 sum = _mm256_setzero_ps();
                    for (int64_t j = 0; j < padded; j += 8) {
                        float *s = scratch.scores + r * padded + j;
                        const __m256 e = exp_nonpositive_avx2(_mm256_sub_ps(_mm256_loadu_ps(s), vm));
                        sum = _mm256_add_ps(sum, e);
                        _mm256_storeu_ps(s, e);
                    }
                    const float total = horizontal_sum(sum);
                    inv[r] = (any && total > 0.0f) ? 1.0f / total : 0.0f;
                }
                for (int64_t col = 0; col < dv; col += 16) {
                    __m256 acc[ROWS][2];
                    weighted_values(group.value_base, group.blocks, group.block_keys, dv, col, scratch.scores, padded,
                                    acc);
                    for (int r = 0; r < rows; r++) {
                        float *orow = out + o_off[g] + (i0 + r) * o_row_stride + col;
                        const __m256 vinv = _mm256_set1_ps(inv[r]);
                        _mm256_storeu_ps(orow, _mm256_mul_ps(acc[r][0], vinv));
                        _mm256_storeu_ps(orow + 8, _mm256_mul_ps(acc[r][1], vinv));
                    }
                }
            }
        }
    }
    return failed;
}

// Keys and values of `nblocks` blocks of kb rows (block i's first row at k + k_off[i], v + v_off[i]) in this kernel's
// layout (key_chunk, value_run), block i at k_packed + i·d·kb and v_packed + i·kb·dv: the AVX-512 fp32 kernel's
// block sizes, so the callers' offsets (cpu_kernel.packed_units) are the same. Packed once per call, a key block is
// then read by every query block that attends to it.
// 8 rows of 8 floats (row t at src + t*src_stride) transposed in registers: column u stored at dst + u*dst_stride
// (unpack, shuffle, then the 128-bit halves swapped).
static inline void transpose8(const float *src, int64_t src_stride, float *dst, int64_t dst_stride) {
    __m256 r[8], t[8];
    for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(src + i * src_stride);
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        r[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int i = 0; i < 4; i++) {
        _mm256_storeu_ps(dst + i * dst_stride, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
        _mm256_storeu_ps(dst + (i + 4) * dst_stride, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
    }
}

// Blocks packed in this kernel's layout (key_chunk, value_run); returns 1 unless kb is a multiple of 16 and dv of 16
// (a block is whole chunks of 16 keys and runs of 16 values: a partial chunk would reach past the block's d·kb
// floats). Each chunk's keys are written as 8 x 8 tiles transposed in registers (8 keys by 8 features; the 8 floats
// of a feature are contiguous in the chunk), as the AVX-512 kernels' packing does with 16 x 16 tiles
// (docs/benchmarks.md, "The key transpose in registers"); features past the last whole tile go one float at a time,
// values in their runs of 16 floats.
extern "C" int longbird_pack_blocks_fp32(
    const float *k, const int64_t *k_off, int64_t k_row_stride,
    const float *v, const int64_t *v_off, int64_t v_row_stride,
    int64_t nblocks, int64_t kb, int64_t d, int64_t dv, float *k_packed, float *v_packed, int threads) {
    if (kb % 16 != 0 || dv % 16 != 0) return 1;
    const int64_t tiled_features = d / 8 * 8;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < nblocks; i++) {
        float *key_block = k_packed + i * d * kb, *value_block = v_packed + i * kb * dv;
        const float *block_keys = k + k_off[i];
        for (int64_t first = 0; first < kb; first += 8) {  // keys first..first+7: half of chunk first / 16
            const float *rows = block_keys + first * k_row_stride;
            float *columns = key_block + key_chunk(first, d);
            for (int64_t c = 0; c < tiled_features; c += 8) transpose8(rows + c, k_row_stride, columns + 16 * c, 16);
            for (int64_t c = tiled_features; c < d; c++)
                for (int64_t t = 0; t < 8; t++) columns[16 * c + t] = rows[t * k_row_stride + c];
        }
        for (int64_t r = 0; r < kb; r++)
            for (int64_t c = 0; c < dv; c += 16)
                memcpy(value_block + value_run(r, c, kb), v + v_off[i] + r * v_row_stride + c, 64);
    }
    return 0;
}
