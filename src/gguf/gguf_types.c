/* Tensor type facts the GGUF reader and writer need: whether a type id is
 * known, its block size and bytes per block, and a tensor's byte size with
 * every multiplication overflow-checked.
 *
 * The facts come from the quant module's table (qt_get); TEMPORARY: until
 * quant_table.c lands, a private copy of the ids and block sizes (tied to
 * blocks.h by sizeof) stands in for it.
 */
#include "gguf/gguf_internal.h"

#include <inttypes.h>
#include <stdio.h>

#include "quant/blocks.h"

typedef struct {
    const char *name;
    int blck, size;
} type_fact;

static const type_fact k_types[QT_COUNT] = {
    [QT_F32] = {"F32", 1, 4},
    [QT_F16] = {"F16", 1, 2},
    [QT_Q4_0] = {"Q4_0", QK4_0, sizeof(block_q4_0)},
    [QT_Q4_1] = {"Q4_1", QK4_1, sizeof(block_q4_1)},
    [QT_Q5_0] = {"Q5_0", QK5_0, sizeof(block_q5_0)},
    [QT_Q5_1] = {"Q5_1", QK5_1, sizeof(block_q5_1)},
    [QT_Q8_0] = {"Q8_0", QK8_0, sizeof(block_q8_0)},
    [QT_Q8_1] = {"Q8_1", QK8_1, sizeof(block_q8_1)},
    [QT_Q2_K] = {"Q2_K", QK_K, sizeof(block_q2_K)},
    [QT_Q3_K] = {"Q3_K", QK_K, sizeof(block_q3_K)},
    [QT_Q4_K] = {"Q4_K", QK_K, sizeof(block_q4_K)},
    [QT_Q5_K] = {"Q5_K", QK_K, sizeof(block_q5_K)},
    [QT_Q6_K] = {"Q6_K", QK_K, sizeof(block_q6_K)},
    [QT_Q8_K] = {"Q8_K", QK_K, sizeof(block_q8_K)},
    [QT_IQ2_XXS] = {"IQ2_XXS", QK_K, sizeof(block_iq2_xxs)},
    [QT_IQ2_XS] = {"IQ2_XS", QK_K, sizeof(block_iq2_xs)},
    [QT_IQ3_XXS] = {"IQ3_XXS", QK_K, sizeof(block_iq3_xxs)},
    [QT_IQ1_S] = {"IQ1_S", QK_K, sizeof(block_iq1_s)},
    [QT_IQ4_NL] = {"IQ4_NL", QK4_NL, sizeof(block_iq4_nl)},
    [QT_IQ3_S] = {"IQ3_S", QK_K, sizeof(block_iq3_s)},
    [QT_IQ2_S] = {"IQ2_S", QK_K, sizeof(block_iq2_s)},
    [QT_IQ4_XS] = {"IQ4_XS", QK_K, sizeof(block_iq4_xs)},
    [QT_I8] = {"I8", 1, 1},
    [QT_I16] = {"I16", 1, 2},
    [QT_I32] = {"I32", 1, 4},
    [QT_I64] = {"I64", 1, 8},
    [QT_F64] = {"F64", 1, 8},
    [QT_IQ1_M] = {"IQ1_M", QK_K, sizeof(block_iq1_m)},
    [QT_BF16] = {"BF16", 1, 2},
    [QT_MXFP4] = {"MXFP4", QK_MXFP4, sizeof(block_mxfp4)},
};

int gguf_qt_info(uint32_t type, int *blck, int *type_size, const char **name) {
    if (type >= QT_COUNT || !k_types[type].name) return 0;
    if (blck) *blck = k_types[type].blck;
    if (type_size) *type_size = k_types[type].size;
    if (name) *name = k_types[type].name;
    return 1;
}

int gguf_tensor_bytes(int type, int n_dims, const int64_t *ne, uint64_t *size, char *msg, size_t msg_n) {
    int blck, ts;
    const char *tname;
    if (type < 0 || !gguf_qt_info((uint32_t)type, &blck, &ts, &tname)) {
        snprintf(msg, msg_n, "unknown tensor type %d", type);
        return -1;
    }
    int64_t nel = 1;
    for (int d = 0; d < n_dims; d++) {
        if (ne[d] <= 0) {
            snprintf(msg, msg_n, "ne[%d] = %" PRId64 " is not positive", d, ne[d]);
            return -1;
        }
        if (ne[d] > INT64_MAX / nel) {
            snprintf(msg, msg_n, "element count overflows int64 at ne[%d] = %" PRId64, d, ne[d]);
            return -1;
        }
        nel *= ne[d];
    }
    if (ne[0] % blck) {
        snprintf(msg, msg_n, "ne[0] = %" PRId64 " is not a multiple of the block size %d of %s", ne[0], blck,
                 tname);
        return -1;
    }
    int64_t nblocks = nel / blck;
    if (nblocks > INT64_MAX / ts) {
        snprintf(msg, msg_n, "byte size overflows int64 (%" PRId64 " blocks of %d bytes)", nblocks, ts);
        return -1;
    }
    *size = (uint64_t)nblocks * (uint64_t)ts;
    return 0;
}
