// Fused block attention for bf16 on CPUs with AVX-512 BF16 (longbird.attention.cpu_kernel builds and loads it).
//
// Why: at the e5-small head size (32) PyTorch's CPU flash kernel spends most of a bf16 BigBird forward on small
// products and bookkeeping (benchmarks: docs/benchmarks.md, "A fused bf16 attention kernel"). Here each group of
// query rows attends to its own list of key blocks, read in place through offset tables (no gathered copies):
//   scores  s = scale * q . k          bf16 pairs multiplied and summed in fp32 (vdpbf16ps), as SDPA's bf16 kernel
//   softmax p = exp(s - max) / sum     in fp32 (exp to 5.6e-5, below p's bf16 rounding); masked keys exactly 0
//   output  o = sum_j p_j v_j          p rounded to bf16 for the product (as SDPA's kernel does), sums in fp32;
//                                      a group with no allowed key outputs 0
// Group g: query rows q + q_off[g] + i * q_row_stride (i < Lq); key block t (t < nkb): rows k + k_off[g*nkb+t] +
// r * k_row_stride (r < kb), value rows likewise, mask bytes mask + m_off[g*nkb+t] + r (1 = may attend; m_off < 0:
// the whole block is masked); output rows out + o_off[g] + i * o_row_stride. Needs d even and <= 128, dv % 16 == 0
// and dv <= 64 (the caller checks and otherwise takes SDPA); returns 1 outside that range, 2 if out of memory.
// packed != 0: k and v are longbird_pack_blocks_bf16's output (kb a multiple of 32) and k_off/v_off index its
// 32-bit pairs, so a key block shared by many query groups is converted once per call instead of once per group.
// alibi != nullptr (LittleBird): alibi (G, 4) holds each group's head slopes [α, β, γ, D_C]; the score of query row
// i and key j is then s − D(p_i, p_j) (bialibi_distance), with p_i = positions[qpos_off[g] + i] and p_j =
// positions[kpos_off[g*nkb+t] + r] for key r of block t, kpos_off < 0 marking a block of packed-context keys.
#include "block_attention_common.h"

static inline uint32_t bf16_pair(const uint16_t *row, int64_t c) {
    return static_cast<uint32_t>(row[2 * c]) | (static_cast<uint32_t>(row[2 * c + 1]) << 16);
}

// acc[r][t] = sum over key pairs of probs (bf16 pairs, row r) times the values' pairs (tile t of 16 columns), for four
// query rows; the blocks are walked in order so that no key index is divided.
template <int TILES>
static inline void weighted_values(const uint32_t *const *value_base, int64_t blocks, int64_t block_keys, int64_t dv,
                                   const uint32_t *probs, int64_t half, __m512 acc[4][4]) {
    __m512 a[4][TILES];
    for (int r = 0; r < 4; r++)
        for (int t = 0; t < TILES; t++) a[r][t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < blocks; b++) {
        const uint32_t *values = value_base[b];
        const uint32_t *p = probs + b * (block_keys / 2);
        for (int64_t rp = 0; rp < block_keys / 2; rp++, values += dv, p++) {
            const __m512bh p0 = (__m512bh)_mm512_set1_epi32(p[0]);
            const __m512bh p1 = (__m512bh)_mm512_set1_epi32(p[half]);
            const __m512bh p2 = (__m512bh)_mm512_set1_epi32(p[2 * half]);
            const __m512bh p3 = (__m512bh)_mm512_set1_epi32(p[3 * half]);
            for (int t = 0; t < TILES; t++) {
                const __m512bh vv = (__m512bh)_mm512_loadu_si512(values + 16 * t);
                a[0][t] = _mm512_dpbf16_ps(a[0][t], p0, vv);
                a[1][t] = _mm512_dpbf16_ps(a[1][t], p1, vv);
                a[2][t] = _mm512_dpbf16_ps(a[2][t], p2, vv);
                a[3][t] = _mm512_dpbf16_ps(a[3][t], p3, vv);
            }
        }
    }
    for (int r = 0; r < 4; r++)
        for (int t = 0; t < TILES; t++) acc[r][t] = a[r][t];
}

extern "C" int longbird_block_attention_bf16(
    const uint16_t *q, const int64_t *q_off, int64_t q_row_stride, int64_t Lq,
    const uint16_t *k, const int64_t *k_off, int64_t k_row_stride,
    const uint16_t *v, const int64_t *v_off, int64_t v_row_stride,
    const uint8_t *mask, const int64_t *m_off,
    int64_t nkb, int64_t kb, int64_t d, int64_t dv,
    uint16_t *out, const int64_t *o_off, int64_t o_row_stride,
    int64_t G, float scale, int packed, int threads,
    const float *alibi, const int64_t *positions, const int64_t *qpos_off, const int64_t *kpos_off) {
    const int64_t Lk = nkb * kb, padded = (Lk + 31) / 32 * 32, pairs = d / 2, tiles = dv / 16;
    if (Lk < 1 || d % 2 != 0 || d > 128 || dv % 16 != 0 || dv > 64 || (packed && kb % 32 != 0)) return 1;
    const uint32_t *k_packed = reinterpret_cast<const uint32_t *>(k), *v_packed = reinterpret_cast<const uint32_t *>(v);
    // The compute loops read keys and values per block: a packed call's own blocks (kb rows each), or one block of
    // `padded` rows that this group packed into the thread's buffers.
    const int64_t blocks = packed ? nkb : 1, block_keys = packed ? kb : padded;
    // Rows of the keys' transposed layout lie key_stride apart: a packed call's blocks, or the thread's buffer,
    // whose rows are 16 elements longer than `padded`: with rows a power of two apart (4096 keys: 16 KB) the
    // copy that writes one key down a column sends its values to one L1 set and thrashes (4 queries over 4,096 keys,
    // 12 heads of 32, fp32, nearly all copying: 4.7 ms a call, 0.7-1.0 ms with the longer rows).
    const int64_t key_stride = packed ? kb : padded + 16;
    auto key_row = [&](int64_t g, int64_t j) { return k + k_off[g * nkb + j / kb] + (j % kb) * k_row_stride; };
    auto value_row = [&](int64_t g, int64_t j) { return v + v_off[g * nkb + j / kb] + (j % kb) * v_row_stride; };
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        // Per thread: keys as bf16 pairs along d, transposed to (d/2, Lk); values as pairs of consecutive keys,
        // (Lk/2, dv) (a packed call reads its blocks in place instead); four rows of bf16 probability pairs; and the
        // group's mask, scores and key positions (GroupScratch).
        uint32_t *key_pairs = packed ? nullptr : static_cast<uint32_t *>(aligned_alloc(64, 4 * pairs * key_stride + 64));
        uint32_t *value_pairs =
            packed ? nullptr : static_cast<uint32_t *>(aligned_alloc(64, 4 * (padded / 2) * dv + 64));
        uint32_t *probs = static_cast<uint32_t *>(aligned_alloc(64, 4 * 4 * (padded / 2) + 64));
        GroupScratch scratch(padded, alibi != nullptr);
        const uint32_t **key_base = static_cast<const uint32_t **>(malloc(sizeof(void *) * blocks));
        const uint32_t **value_base = static_cast<const uint32_t **>(malloc(sizeof(void *) * blocks));
        if ((!packed && (!key_pairs || !value_pairs)) || !scratch.allocated(alibi != nullptr) ||
            !probs || !key_base || !value_base) {
#pragma omp atomic write
            failed = 2;
        }
#pragma omp for schedule(static)
        for (int64_t g = 0; g < G; g++) {
            if (failed) continue;
            // The additive mask (keys past Lk, up to the next multiple of 32, are masked), then the keys and values
            // as bf16 pairs: read from the packed blocks, or packed here from the rows.
            const int any = scratch.prepare(mask, m_off, g, nkb, kb, padded, positions, alibi ? kpos_off : nullptr);
            if (packed) {
                for (int64_t t = 0; t < nkb; t++) {
                    key_base[t] = k_packed + k_off[g * nkb + t];
                    value_base[t] = v_packed + v_off[g * nkb + t];
                }
            } else {
                for (int64_t j = 0; j < padded; j++) {
                    const uint16_t *krow = j < Lk ? key_row(g, j) : nullptr;
                    for (int64_t c = 0; c < pairs; c++) key_pairs[c * key_stride + j] = krow ? bf16_pair(krow, c) : 0u;
                }
                for (int64_t j = 0; j < padded; j += 2) {
                    const uint16_t *v0 = j < Lk ? value_row(g, j) : nullptr;
                    const uint16_t *v1 = j + 1 < Lk ? value_row(g, j + 1) : nullptr;
                    uint32_t *dst = value_pairs + (j / 2) * dv;
                    for (int64_t e = 0; e < dv; e++)
                        dst[e] = (v0 ? static_cast<uint32_t>(v0[e]) : 0u) |
                                 (v1 ? static_cast<uint32_t>(v1[e]) << 16 : 0u);
                }
                key_base[0] = key_pairs;
                value_base[0] = value_pairs;
            }
            for (int64_t i0 = 0; i0 < Lq; i0 += 4) {
                const int64_t rows = Lq - i0 < 4 ? Lq - i0 : 4;
                uint32_t qp[4][64];
                for (int r = 0; r < 4; r++) {
                    const uint16_t *qrow = q + q_off[g] + (i0 + (r < rows ? r : 0)) * q_row_stride;
                    for (int64_t c = 0; c < pairs; c++) qp[r][c] = bf16_pair(qrow, c);
                }
                float query_position[4];
                query_positions(alibi ? positions : nullptr, qpos_off, g, i0, rows, query_position);
                __m512 top[4];
                for (int r = 0; r < 4; r++) top[r] = _mm512_set1_ps(-INFINITY);
                const __m512 vscale = _mm512_set1_ps(scale);
                // 32 keys at a time: each broadcast query pair feeds two products (two loads of keys per four
                // broadcasts instead of one), padded and packed blocks being multiples of 32.
                for (int64_t j = 0; j < padded; j += 32) {
                    const uint32_t *keys = key_base[j / block_keys] + j % block_keys;  // 1 division per 128 products
                    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
                    for (int64_t c = 0; c < pairs; c++) {
                        const __m512bh k0 = (__m512bh)_mm512_loadu_si512(keys + c * key_stride);
                        const __m512bh k1 = (__m512bh)_mm512_loadu_si512(keys + c * key_stride + 16);
                        const __m512bh q0 = (__m512bh)_mm512_set1_epi32(qp[0][c]);
                        const __m512bh q1 = (__m512bh)_mm512_set1_epi32(qp[1][c]);
                        const __m512bh q2 = (__m512bh)_mm512_set1_epi32(qp[2][c]);
                        const __m512bh q3 = (__m512bh)_mm512_set1_epi32(qp[3][c]);
                        a0 = _mm512_dpbf16_ps(a0, q0, k0);
                        b0 = _mm512_dpbf16_ps(b0, q0, k1);
                        a1 = _mm512_dpbf16_ps(a1, q1, k0);
                        b1 = _mm512_dpbf16_ps(b1, q1, k1);
                        a2 = _mm512_dpbf16_ps(a2, q2, k0);
                        b2 = _mm512_dpbf16_ps(b2, q2, k1);
                        a3 = _mm512_dpbf16_ps(a3, q3, k0);
                        b3 = _mm512_dpbf16_ps(b3, q3, k1);
                    }
                    const __m512 raw[4][2] = {{a0, b0}, {a1, b1}, {a2, b2}, {a3, b3}};
                    finish_scores(raw, j, vscale, scratch, alibi ? alibi + 4 * g : nullptr, query_position, padded, top);
                }
                float total[4];
                for (int r = 0; r < 4; r++) {
                    float m = _mm512_reduce_max_ps(top[r]);
                    if (m == -INFINITY) m = 0.0f;
                    const __m512 vm = _mm512_set1_ps(m);
                    __m512 sum = _mm512_setzero_ps();
                    for (int64_t j = 0; j < padded; j += 32) {
                        const __m512 e0 = exp_nonpositive<4>(_mm512_sub_ps(_mm512_loadu_ps(scratch.scores + r * padded + j), vm));
                        const __m512 e1 = exp_nonpositive<4>(_mm512_sub_ps(_mm512_loadu_ps(scratch.scores + r * padded + j + 16), vm));
                        sum = _mm512_add_ps(sum, _mm512_add_ps(e0, e1));
                        _mm512_storeu_si512(probs + r * (padded / 2) + j / 2, (__m512i)_mm512_cvtne2ps_pbh(e1, e0));
                    }
                    total[r] = _mm512_reduce_add_ps(sum);
                }
                __m512 acc[4][4];
                switch (tiles) {  // the accumulators stay in registers only with a compile-time tile count
                    case 1: weighted_values<1>(value_base, blocks, block_keys, dv, probs, padded / 2, acc); break;
                    case 2: weighted_values<2>(value_base, blocks, block_keys, dv, probs, padded / 2, acc); break;
                    case 3: weighted_values<3>(value_base, blocks, block_keys, dv, probs, padded / 2, acc); break;
                    default: weighted_values<4>(value_base, blocks, block_keys, dv, probs, padded / 2, acc); break;
                }
                for (int r = 0; r < rows; r++) {
                    const float inv = (any && total[r] > 0.0f) ? 1.0f / total[r] : 0.0f;
                    uint16_t *orow = out + o_off[g] + (i0 + r) * o_row_stride;
                    for (int64_t t = 0; t < tiles; t++) {
                        const __m256bh o = _mm512_cvtneps_pbh(_mm512_mul_ps(acc[r][t], _mm512_set1_ps(inv)));
                        _mm256_storeu_si256(reinterpret_cast<__m256i *>(orow + 16 * t), (__m256i)o);
                    }
                }
            }
        }
        free(key_pairs);
        free(value_pairs);
        free(probs);
        free(key_base);
        free(value_base);
    }
    return failed;
}

// Keys and values of `nblocks` blocks of kb rows (block i's first row at k + k_off[i], v + v_off[i]) as the bf16
// pairs the attention reads: keys (d/2, kb) per block at k_packed + i*(d/2)*kb, values (kb/2, dv) per block at
// v_packed + i*(kb/2)*dv. Packed once per call, a key block is then read by every query block that attends to it.
extern "C" int longbird_pack_blocks_bf16(
    const uint16_t *k, const int64_t *k_off, int64_t k_row_stride,
    const uint16_t *v, const int64_t *v_off, int64_t v_row_stride,
    int64_t nblocks, int64_t kb, int64_t d, int64_t dv, uint32_t *k_packed, uint32_t *v_packed, int threads) {
    if (kb % 2 != 0 || d % 2 != 0) return 1;
    const int64_t pairs = d / 2;
    // Pairs are whole 32-bit words when every key row starts at an even element: an even row stride and even block
    // offsets (true of every (B, H, l, d) layout with d even), and a 4-byte aligned tensor.
    bool words = k_row_stride % 2 == 0 && reinterpret_cast<uintptr_t>(k) % 4 == 0;
    for (int64_t i = 0; i < nblocks && words; i++) words = k_off[i] % 2 == 0;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < nblocks; i++) {
        uint32_t *kd = k_packed + i * pairs * kb, *vd = v_packed + i * (kb / 2) * dv;
        if (words) {  // a key row's bf16 pairs are 32-bit words: transposed as such
            transpose_words(reinterpret_cast<const uint32_t *>(k + k_off[i]), k_row_stride / 2, kb, pairs, kd, kb);
        } else {
            for (int64_t r = 0; r < kb; r++) {
                const uint16_t *krow = k + k_off[i] + r * k_row_stride;
                for (int64_t c = 0; c < pairs; c++) kd[c * kb + r] = bf16_pair(krow, c);
            }
        }
        for (int64_t r = 0; r < kb; r += 2) {  // rows r and r+1 interleaved: value e of row r low, of row r+1 high
            const uint16_t *v0 = v + v_off[i] + r * v_row_stride, *v1 = v0 + v_row_stride;
            uint32_t *row = vd + (r / 2) * dv;
            int64_t e = 0;
            for (; e + 16 <= dv; e += 16) {
                const __m512i low = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(v0 + e)));
                const __m512i high = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(v1 + e)));
                _mm512_storeu_si512(row + e, _mm512_or_si512(low, _mm512_slli_epi32(high, 16)));
            }
            for (; e < dv; e++) row[e] = static_cast<uint32_t>(v0[e]) | (static_cast<uint32_t>(v1[e]) << 16);
        }
    }
    return 0;
}
