/* The quant type table: for every GGUF type id Strata reads, its name, block
 * geometry, the activation format its dot product takes, and its reference
 * dequantizer and quantizer. Everything that needs per-format facts (the GGUF
 * reader's size checks, the backends' dispatch, the tests) asks this table, so
 * a format is described in exactly one place.
 *
 * Block sizes come from blocks.h (sizeof of each layout, which blocks.h
 * asserts), never from a second list of numbers.
 *
 * The quantizers live in quant_quantize*.c (declared in quant_impl.h). They
 * are plain references, not weak ones: a weak reference would not pull their
 * object out of the static archive (libstrata.a), leaving a NULL entry in
 * programs linked against it.
 */
#include <stddef.h>

#include "core/log.h"
#include "quant/quant_impl.h"

/* One entry: type id, GGUF name, weights per block, block struct, dot activation type, lower name. */
#define QT_ENTRY(id, nm, blk, blktype, dot, lower)                                                                     \
    [id] = {.name = nm,                                                                                                \
            .blck = blk,                                                                                               \
            .type_size = (int)sizeof(blktype),                                                                         \
            .vec_dot_type = dot,                                                                                       \
            .dequant = qt_dequant_##lower,                                                                             \
            .quantize = qt_quantize_##lower}
/* Non-weight element types: no quantizer, no dot product. */
#define QT_PLAIN(id, nm, ctype, lower)                                                                                 \
    [id] = {.name = nm,                                                                                                \
            .blck = 1,                                                                                                 \
            .type_size = (int)sizeof(ctype),                                                                           \
            .vec_dot_type = QT_F32,                                                                                    \
            .dequant = qt_dequant_##lower,                                                                             \
            .quantize = NULL}

static const qt_traits qt_table[QT_COUNT] = {
    QT_ENTRY(QT_F32, "F32", 1, float, QT_F32, f32),
    QT_ENTRY(QT_F16, "F16", 1, uint16_t, QT_F32, f16),
    QT_ENTRY(QT_BF16, "BF16", 1, uint16_t, QT_F32, bf16),
    QT_ENTRY(QT_Q4_0, "Q4_0", QK4_0, block_q4_0, QT_Q8_0, q4_0),
    QT_ENTRY(QT_Q4_1, "Q4_1", QK4_1, block_q4_1, QT_Q8_1, q4_1),
    QT_ENTRY(QT_Q5_0, "Q5_0", QK5_0, block_q5_0, QT_Q8_0, q5_0),
    QT_ENTRY(QT_Q5_1, "Q5_1", QK5_1, block_q5_1, QT_Q8_1, q5_1),
    QT_ENTRY(QT_Q8_0, "Q8_0", QK8_0, block_q8_0, QT_Q8_0, q8_0),
    QT_ENTRY(QT_Q8_1, "Q8_1", QK8_1, block_q8_1, QT_Q8_1, q8_1),
    QT_ENTRY(QT_Q2_K, "Q2_K", QK_K, block_q2_K, QT_Q8_K, q2_k),
    QT_ENTRY(QT_Q3_K, "Q3_K", QK_K, block_q3_K, QT_Q8_K, q3_k),
    QT_ENTRY(QT_Q4_K, "Q4_K", QK_K, block_q4_K, QT_Q8_K, q4_k),
    QT_ENTRY(QT_Q5_K, "Q5_K", QK_K, block_q5_K, QT_Q8_K, q5_k),
    QT_ENTRY(QT_Q6_K, "Q6_K", QK_K, block_q6_K, QT_Q8_K, q6_k),
    QT_ENTRY(QT_Q8_K, "Q8_K", QK_K, block_q8_K, QT_Q8_K, q8_k),
    QT_ENTRY(QT_IQ2_XXS, "IQ2_XXS", QK_K, block_iq2_xxs, QT_Q8_K, iq2_xxs),
    QT_ENTRY(QT_IQ2_XS, "IQ2_XS", QK_K, block_iq2_xs, QT_Q8_K, iq2_xs),
    QT_ENTRY(QT_IQ2_S, "IQ2_S", QK_K, block_iq2_s, QT_Q8_K, iq2_s),
    QT_ENTRY(QT_IQ3_XXS, "IQ3_XXS", QK_K, block_iq3_xxs, QT_Q8_K, iq3_xxs),
    QT_ENTRY(QT_IQ3_S, "IQ3_S", QK_K, block_iq3_s, QT_Q8_K, iq3_s),
    QT_ENTRY(QT_IQ1_S, "IQ1_S", QK_K, block_iq1_s, QT_Q8_K, iq1_s),
    QT_ENTRY(QT_IQ1_M, "IQ1_M", QK_K, block_iq1_m, QT_Q8_K, iq1_m),
    QT_ENTRY(QT_IQ4_NL, "IQ4_NL", QK4_NL, block_iq4_nl, QT_Q8_0, iq4_nl),
    QT_ENTRY(QT_IQ4_XS, "IQ4_XS", QK_K, block_iq4_xs, QT_Q8_K, iq4_xs),
    QT_ENTRY(QT_MXFP4, "MXFP4", QK_MXFP4, block_mxfp4, QT_Q8_0, mxfp4),
    QT_PLAIN(QT_I8, "I8", int8_t, i8),
    QT_PLAIN(QT_I16, "I16", int16_t, i16),
    QT_PLAIN(QT_I32, "I32", int32_t, i32),
    QT_PLAIN(QT_I64, "I64", int64_t, i64),
    QT_PLAIN(QT_F64, "F64", double, f64),
};

#undef QT_ENTRY
#undef QT_PLAIN

const qt_traits *qt_get(qt_type t) {
    /* the id often comes straight from a file: check it as an unsigned index */
    if ((unsigned)t >= (unsigned)QT_COUNT || qt_table[t].name == NULL) return NULL;
    return &qt_table[t];
}

static int ascii_lower(int c) { return (c >= 'A' && c <= 'Z') ? c - 'A' + 'a' : c; }

int qt_from_name(const char *name) {
    if (name == NULL) return -1;
    for (int t = 0; t < QT_COUNT; t++) {
        const char *a = qt_table[t].name, *b = name;
        if (a == NULL) continue;
        while (*a && ascii_lower((unsigned char)*a) == ascii_lower((unsigned char)*b)) a++, b++;
        if (*a == '\0' && *b == '\0') return t;
    }
    return -1;
}

/* Returns 0 and sets the error for an unknown type, a negative n, or an n that
 * is not a whole number of blocks (both can come from a malformed file). */
size_t qt_row_size(qt_type t, int64_t n) {
    const qt_traits *tr = qt_get(t);
    if (tr == NULL) {
        st_error_set("qt_row_size: unknown quant type %d", (int)t);
        return 0;
    }
    if (n < 0 || n % tr->blck != 0) {
        st_error_set("qt_row_size: %lld weights is not a whole number of %s blocks of %d", (long long)n, tr->name,
                     tr->blck);
        return 0;
    }
    return (size_t)(n / tr->blck) * (size_t)tr->type_size;
}

void qt_dequantize(qt_type t, const void *src, float *dst, int64_t n) {
    const qt_traits *tr = qt_get(t);
    ST_ASSERT(tr != NULL && tr->dequant != NULL);
    ST_ASSERT(n >= 0 && n % tr->blck == 0);
    tr->dequant(src, dst, n);
}

/* qt_quantize() (the same dispatch over .quantize) lives in quant_quantize.c, as quant.h says. */
