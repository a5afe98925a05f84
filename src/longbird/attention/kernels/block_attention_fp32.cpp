// Fused block attention for fp32 on CPUs with AVX-512 (longbird.attention.cpu_kernel builds and loads it).
//
// Why: in fp32 at the e5-small head size (32) PyTorch's CPU flash kernel and BigBird's gathered key blocks take
// about as long as the model's linear layers (docs/benchmarks.md, "The fused kernel in fp32"). The same groups,
// offset tables, masks, packed blocks and BiALiBi distance as the bf16 kernel (block_attention_bf16.cpp, whose
// header comment defines the arguments), with every step in fp32:
//   scores  s = scale * q . k          fp32 products summed in fp32 (FMA), 32 keys x 4 query rows at a time
//   softmax p = exp(s - max) / sum     exp to about 1e-7 (Cephes' degree-6 polynomial); masked keys exactly 0
//   output  o = sum_j p_j v_j          fp32; a group with no allowed key outputs 0
// Needs d <= 128 and dv % 16 == 0, dv <= 64 (the caller checks and otherwise takes SDPA); returns 1 outside that
// range, 2 if out of memory. packed != 0: k and v are longbird_pack_blocks_fp32's output (kb a multiple of 32), keys
// as (d, kb) and values as (kb, dv) per block, and k_off/v_off index its floats.
#include "block_attention_common.h"

// acc[r][t] = sum over keys of probs (row r, rows `stride` floats apart) times the values' tile t of 16 columns, for
// four query rows; the blocks are walked in order so that no key index is divided.
template <int TILES>
static inline void weighted_values(const float *const *value_base, int64_t blocks, int64_t block_keys, int64_t dv,
                                   const float *probs, int64_t stride, __m512 acc[4][4]) {
    __m512 a[4][TILES];
    for (int r = 0; r < 4; r++)
        for (int t = 0; t < TILES; t++) a[r][t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < blocks; b++) {
        const float *values = value_base[b];
        const float *p = probs + b * block_keys;
        for (int64_t j = 0; j < block_keys; j++, values += dv, p++) {
            const __m512 p0 = _mm512_set1_ps(p[0]), p1 = _mm512_set1_ps(p[stride]);
            const __m512 p2 = _mm512_set1_ps(p[2 * stride]), p3 = _mm512_set1_ps(p[3 * stride]);
            for (int t = 0; t < TILES; t++) {
                const __m512 vv = _mm512_loadu_ps(values + 16 * t);
                a[0][t] = _mm512_fmadd_ps(p0, vv, a[0][t]);
                a[1][t] = _mm512_fmadd_ps(p1, vv, a[1][t]);
                a[2][t] = _mm512_fmadd_ps(p2, vv, a[2][t]);
                a[3][t] = _mm512_fmadd_ps(p3, vv, a[3][t]);
            }
        }
    }
    for (int r = 0; r < 4; r++)
        for (int t = 0; t < TILES; t++) acc[r][t] = a[r][t];
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
    const int64_t Lk = nkb * kb, padded = (Lk + 31) / 32 * 32, tiles = dv / 16;
    if (Lk < 1 || d < 1 || d > 128 || dv % 16 != 0 || dv > 64 || (packed && kb % 32 != 0)) return 1;
    // The compute loops read keys and values per block: a packed call's own blocks (kb rows each), or one block of
    // `padded` rows that this group copied into the thread's buffers.
    const int64_t blocks = packed ? nkb : 1, block_keys = packed ? kb : padded;
    // Rows of the keys' transposed layout lie key_stride apart: a packed call's blocks, or the thread's buffer,
    // whose rows are 16 elements longer than `padded`: with rows a power of two apart (4096 keys: 16 KB) the
    // copy that writes one key down a column sends its values to one L1 set and thrashes (4 queries over 4,096 keys,
    // 12 heads of 32, fp32, nearly all copying: 4.7 ms a call, 0.7-1.0 ms with the longer rows).
    const int64_t key_stride = packed ? kb : padded + 16;
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        // Per thread: keys transposed to (d, Lk), values (Lk, dv) (unpacked calls only); the group's mask, scores
        // (then probabilities) and key positions (GroupScratch).
        float *key_t = packed ? nullptr : static_cast<float *>(aligned_alloc(64, 4 * d * key_stride + 64));
        float *value_rows = packed ? nullptr : static_cast<float *>(aligned_alloc(64, 4 * padded * dv + 64));
        GroupScratch scratch(padded, alibi != nullptr);
        const float **key_base = static_cast<const float **>(malloc(sizeof(void *) * blocks));
        const float **value_base = static_cast<const float **>(malloc(sizeof(void *) * blocks));
        if ((!packed && (!key_t || !value_rows)) || !scratch.allocated(alibi != nullptr) ||
            !key_base || !value_base) {
#pragma omp atomic write
            failed = 2;
        }
#pragma omp for schedule(static)
        for (int64_t g = 0; g < G; g++) {
            if (failed) continue;
            const int any = scratch.prepare(mask, m_off, g, nkb, kb, padded, positions, alibi ? kpos_off : nullptr);
            if (packed) {
                for (int64_t t = 0; t < nkb; t++) {
                    key_base[t] = k + k_off[g * nkb + t];
                    value_base[t] = v + v_off[g * nkb + t];
                }
            } else {
                for (int64_t j = 0; j < padded; j++) {
                    const float *krow = j < Lk ? k + k_off[g * nkb + j / kb] + (j % kb) * k_row_stride : nullptr;
                    const float *vrow = j < Lk ? v + v_off[g * nkb + j / kb] + (j % kb) * v_row_stride : nullptr;
                    for (int64_t c = 0; c < d; c++) key_t[c * key_stride + j] = krow ? krow[c] : 0.0f;
                    if (vrow) memcpy(value_rows + j * dv, vrow, 4 * dv);
                    else memset(value_rows + j * dv, 0, 4 * dv);
                }
                key_base[0] = key_t;
                value_base[0] = value_rows;
            }
            for (int64_t i0 = 0; i0 < Lq; i0 += 4) {
                const int64_t rows = Lq - i0 < 4 ? Lq - i0 : 4;
                const float *qrow[4];
                for (int r = 0; r < 4; r++) qrow[r] = q + q_off[g] + (i0 + (r < rows ? r : 0)) * q_row_stride;
                float query_position[4];
                query_positions(alibi ? positions : nullptr, qpos_off, g, i0, rows, query_position);
                __m512 top[4];
                for (int r = 0; r < 4; r++) top[r] = _mm512_set1_ps(-INFINITY);
                const __m512 vscale = _mm512_set1_ps(scale);
                for (int64_t j = 0; j < padded; j += 32) {
                    const float *keys = key_base[j / block_keys] + j % block_keys;
                    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
                    for (int64_t c = 0; c < d; c++) {
                        const __m512 k0 = _mm512_loadu_ps(keys + c * key_stride);
                        const __m512 k1 = _mm512_loadu_ps(keys + c * key_stride + 16);
                        const __m512 q0 = _mm512_set1_ps(qrow[0][c]), q1 = _mm512_set1_ps(qrow[1][c]);
                        const __m512 q2 = _mm512_set1_ps(qrow[2][c]), q3 = _mm512_set1_ps(qrow[3][c]);
                        a0 = _mm512_fmadd_ps(q0, k0, a0);
                        b0 = _mm512_fmadd_ps(q0, k1, b0);
                        a1 = _mm512_fmadd_ps(q1, k0, a1);
                        b1 = _mm512_fmadd_ps(q1, k1, b1);
                        a2 = _mm512_fmadd_ps(q2, k0, a2);
                        b2 = _mm512_fmadd_ps(q2, k1, b2);
                        a3 = _mm512_fmadd_ps(q3, k0, a3);
                        b3 = _mm512_fmadd_ps(q3, k1, b3);
                    }
                    const __m512 raw[4][2] = {{a0, b0}, {a1, b1}, {a2, b2}, {a3, b3}};
                    finish_scores(raw, j, vscale, scratch, alibi ? alibi + 4 * g : nullptr, query_position, padded, top);
                }
                float total[4];
                for (int r = 0; r < 4; r++) {  // probabilities overwrite the scores
                    float m = _mm512_reduce_max_ps(top[r]);
                    if (m == -INFINITY) m = 0.0f;
                    const __m512 vm = _mm512_set1_ps(m);
                    __m512 sum = _mm512_setzero_ps();
                    for (int64_t j = 0; j < padded; j += 16) {
                        float *s = scratch.scores + r * padded + j;
                        const __m512 e = exp_nonpositive<6>(_mm512_sub_ps(_mm512_loadu_ps(s), vm));
                        sum = _mm512_add_ps(sum, e);
                        _mm512_storeu_ps(s, e);
                    }
                    total[r] = _mm512_reduce_add_ps(sum);
                }
                __m512 acc[4][4];
                switch (tiles) {  // the accumulators stay in registers only with a compile-time tile count
                    case 1: weighted_values<1>(value_base, blocks, block_keys, dv, scratch.scores, padded, acc); break;
                    case 2: weighted_values<2>(value_base, blocks, block_keys, dv, scratch.scores, padded, acc); break;
                    case 3: weighted_values<3>(value_base, blocks, block_keys, dv, scratch.scores, padded, acc); break;
                    default: weighted_values<4>(value_base, blocks, block_keys, dv, scratch.scores, padded, acc); break;
                }
                for (int r = 0; r < rows; r++) {
                    const float inv = (any && total[r] > 0.0f) ? 1.0f / total[r] : 0.0f;
                    float *orow = out + o_off[g] + (i0 + r) * o_row_stride;
                    for (int64_t t = 0; t < tiles; t++)
                        _mm512_storeu_ps(orow + 16 * t, _mm512_mul_ps(acc[r][t], _mm512_set1_ps(inv)));
                }
            }
        }
        free(key_t);
        free(value_rows);
        free(key_base);
        free(value_base);
    }
    return failed;
}

// Keys and values of `nblocks` blocks of kb rows (block i's first row at k + k_off[i], v + v_off[i]) as the fp32
// kernel reads them: keys transposed, (d, kb) per block at k_packed + i*d*kb, values (kb, dv) per block at
// v_packed + i*kb*dv. Packed once per call, a key block is then read by every query block that attends to it.
extern "C" int longbird_pack_blocks_fp32(
    const float *k, const int64_t *k_off, int64_t k_row_stride,
    const float *v, const int64_t *v_off, int64_t v_row_stride,
    int64_t nblocks, int64_t kb, int64_t d, int64_t dv, float *k_packed, float *v_packed, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < nblocks; i++) {
        float *kd = k_packed + i * d * kb, *vd = v_packed + i * kb * dv;
        transpose_words(reinterpret_cast<const uint32_t *>(k + k_off[i]), k_row_stride, kb, d,
                        reinterpret_cast<uint32_t *>(kd), kb);
        for (int64_t r = 0; r < kb; r++) memcpy(vd + r * dv, v + v_off[i] + r * v_row_stride, 4 * dv);
    }
    return 0;
}
