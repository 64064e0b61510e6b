/* Tensor type facts the GGUF reader and writer need: whether a type id is
 * known, its block size and bytes per block (all from the quant module's
 * table, qt_get, so a format is described in one place), and a tensor's byte
 * size with every multiplication overflow-checked.
 */
#include "gguf/gguf_internal.h"

#include <inttypes.h>
#include <stdio.h>

#include "quant/quant.h"

int gguf_qt_info(uint32_t type, int *blck, int *type_size, const char **name) {
    /* qt_get checks the id as an unsigned index, so any uint32 from a file is safe */
    const qt_traits *tr = type < (uint32_t)QT_COUNT ? qt_get((qt_type)type) : NULL;
    if (!tr) return 0;
    if (blck) *blck = tr->blck;
    if (type_size) *type_size = tr->type_size;
    if (name) *name = tr->name;
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
        snprintf(msg, msg_n, "ne[0] = %" PRId64 " is not a multiple of the block size %d of %s", ne[0], blck, tname);
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
