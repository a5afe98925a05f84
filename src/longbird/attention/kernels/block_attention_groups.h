// What every block attention kernel shares whatever its vector instructions (the AVX-512 kernels through
// block_attention_common.h, block_attention_fp32_avx2.cpp directly): the per-thread buffers of one query group and
// the query rows' positions. Nothing here uses vector intrinsics, so it compiles under any target flags.
#pragma once
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

// The per-thread buffers every kernel uses for one query group at a time: its additive mask over `padded` key slots
// (0 = may attend, -inf otherwise; slots past Lk = nkb·kb, up to the next multiple of 32, are masked), four rows of
// scores (the AVX-512 kernels' query rows at a time), and with BiALiBi each key's position id (or that it is a
// packed-context key, kpos_off < 0).
struct GroupScratch {
    float *bias, *scores, *key_position = nullptr, *key_is_pack = nullptr;
    GroupScratch(int64_t padded, bool alibi)
        : bias(static_cast<float *>(aligned_alloc(64, 4 * padded + 64))),
          scores(static_cast<float *>(aligned_alloc(64, 4 * 4 * padded + 64))) {
        if (alibi) {
            key_position = static_cast<float *>(aligned_alloc(64, 4 * padded + 64));
            key_is_pack = static_cast<float *>(aligned_alloc(64, 4 * padded + 64));
        }
    }
    GroupScratch(const GroupScratch &) = delete;
    GroupScratch &operator=(const GroupScratch &) = delete;
    ~GroupScratch() {
        free(bias);
        free(scores);
        free(key_position);
        free(key_is_pack);
    }
    bool allocated(bool alibi) const { return bias && scores && (!alibi || (key_position && key_is_pack)); }

    // Group g's mask (and key positions when `kpos_off` is given); returns whether any key is allowed.
    int prepare(const uint8_t *mask, const int64_t *m_off, int64_t g, int64_t nkb, int64_t kb, int64_t padded,
                const int64_t *positions, const int64_t *kpos_off) {
        const int64_t Lk = nkb * kb;
        int any = 0;
        for (int64_t j = 0; j < padded; j++) {
            bool allowed = false;
            if (j < Lk) {
                const int64_t moff = m_off[g * nkb + j / kb];
                allowed = moff >= 0 && mask[moff + j % kb];
            }
            bias[j] = allowed ? 0.0f : -INFINITY;
            any |= allowed;
        }
        if (kpos_off) {
            for (int64_t j = 0; j < padded; j++) {
                const int64_t poff = j < Lk ? kpos_off[g * nkb + j / kb] : -1;
                key_is_pack[j] = poff < 0 ? 1.0f : 0.0f;
                key_position[j] = poff < 0 ? 0.0f : static_cast<float>(positions[poff + j % kb]);
            }
        }
        return any;
    }
};

// The position ids of query rows i0..i0+ROWS-1 of group g (rows past `rows` repeat row i0), for BiALiBi; zeros
// without.
template <int ROWS = 4>
static inline void query_positions(const int64_t *positions, const int64_t *qpos_off, int64_t g, int64_t i0,
                                   int64_t rows, float out[ROWS]) {
    for (int r = 0; r < ROWS; r++)
        out[r] = positions ? static_cast<float>(positions[qpos_off[g] + i0 + (r < rows ? r : 0)]) : 0.0f;
}

// One query group's keys and values as the fp32 kernels read them, with the per-thread buffers they need: a packed
// call's blocks read in place (pointers into longbird_pack_blocks_fp32's output, keys (d, kb) and values (kb, dv) per
// block), otherwise the group's keys copied transposed to (d, padded) and its values to (padded, dv), as one block
// of `padded` rows whose slots past Lk are zero. The compute loops walk `blocks` blocks of `block_keys` keys, key
// rows `key_stride` floats apart.
struct GroupKeysFp32 {
    const bool packed;
    const int64_t d, dv, nkb, kb, Lk, padded, blocks, block_keys, key_stride;
    float *key_t = nullptr, *value_rows = nullptr;
    const float **key_base, **value_base;
    // A thread's buffer rows are 16 elements longer than `padded`: with rows a power of two apart (4096 keys: 16 KB)
    // the copy that writes one key down a column sends its values to one L1 set and thrashes (4 queries over 4,096
    // keys, 12 heads of 32, fp32, AVX-512, nearly all copying: 4.7 ms a call, 0.7-1.0 ms with the longer rows).
    GroupKeysFp32(bool packed, int64_t d, int64_t dv, int64_t nkb, int64_t kb, int64_t padded)
        : packed(packed), d(d), dv(dv), nkb(nkb), kb(kb), Lk(nkb * kb), padded(padded), blocks(packed ? nkb : 1),
          block_keys(packed ? kb : padded), key_stride(packed ? kb : padded + 16),
          key_base(static_cast<const float **>(malloc(sizeof(void *) * blocks))),
          value_base(static_cast<const float **>(malloc(sizeof(void *) * blocks))) {
        if (!packed) {
            key_t = static_cast<float *>(aligned_alloc(64, 4 * d * key_stride + 64));
            value_rows = static_cast<float *>(aligned_alloc(64, 4 * padded * dv + 64));
        }
    }
    GroupKeysFp32(const GroupKeysFp32 &) = delete;
    GroupKeysFp32 &operator=(const GroupKeysFp32 &) = delete;
    ~GroupKeysFp32() {
        free(key_t);
        free(value_rows);
        free(key_base);
        free(value_base);
    }
    bool allocated() const { return key_base && value_base && (packed || (key_t && value_rows)); }

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
            for (int64_t c = 0; c < d; c++) key_t[c * key_stride + j] = krow ? krow[c] : 0.0f;
            if (vrow) memcpy(value_rows + j * dv, vrow, 4 * dv);
            else memset(value_rows + j * dv, 0, 4 * dv);
        }
        key_base[0] = key_t;
        value_base[0] = value_rows;
    }
};

// Keys and values of `nblocks` blocks of kb rows (block i's first row at k + k_off[i], v + v_off[i]) as the fp32
// kernels read them: keys transposed, (d, kb) per block at k_packed + i*d*kb, values (kb, dv) per block at
// v_packed + i*kb*dv. Packed once per call, a key block is then read by every query block that attends to it.
static inline void pack_blocks_fp32(const float *k, const int64_t *k_off, int64_t k_row_stride, const float *v,
                                    const int64_t *v_off, int64_t v_row_stride, int64_t nblocks, int64_t kb,
                                    int64_t d, int64_t dv, float *k_packed, float *v_packed, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < nblocks; i++) {
        float *kd = k_packed + i * d * kb, *vd = v_packed + i * kb * dv;
        for (int64_t r = 0; r < kb; r++) {
            const float *krow = k + k_off[i] + r * k_row_stride;
            for (int64_t c = 0; c < d; c++) kd[c * kb + r] = krow[c];
            memcpy(vd + r * dv, v + v_off[i] + r * v_row_stride, 4 * dv);
        }
    }
}
