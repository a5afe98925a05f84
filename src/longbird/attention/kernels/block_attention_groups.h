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

// The position ids of query rows i0..i0+3 of group g (rows past `rows` repeat row i0), for BiALiBi; zeros without.
static inline void query_positions(const int64_t *positions, const int64_t *qpos_off, int64_t g, int64_t i0,
                                   int64_t rows, float out[4]) {
    for (int r = 0; r < 4; r++)
        out[r] = positions ? static_cast<float>(positions[qpos_off[g] + i0 + (r < rows ? r : 0)]) : 0.0f;
}
