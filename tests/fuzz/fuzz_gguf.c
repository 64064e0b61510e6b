/* libFuzzer target for the GGUF reader.
 *
 * Each input is opened with gguf_open_buffer; if it is accepted, everything
 * reachable through the public API is walked (every key and value, arrays of
 * arrays to the bottom, every tensor and its bytes), so ASan/UBSan see every
 * read the reader lets a caller make. Beyond memory errors the target checks
 * the reader's promises and traps when one breaks: a refusal carries a message
 * naming the input; an accepted file's lookups find what iteration finds, and
 * each tensor lies aligned inside the buffer.
 */
#include <stdint.h>
#include <string.h>

#include "core/log.h"
#include "gguf/gguf.h"

#define REQUIRE(c)                                                                                                     \
    do {                                                                                                               \
        if (!(c)) __builtin_trap();                                                                                    \
    } while (0)

static volatile uint64_t g_sink; /* keeps the walks from being optimised away */

static void walk_value(const gguf_value *v, int depth) {
    REQUIRE(depth <= 8);
    if (v->type != GGUF_T_ARRAY) {
        int64_t i;
        double d;
        const char *s;
        uint64_t len;
        if (gguf_arr_get_i64(v, 0, &i) == 0) g_sink += (uint64_t)i;
        if (gguf_arr_get_f64(v, 0, &d) == 0) g_sink += (uint64_t)(d == d);
        if (gguf_arr_get_str(v, 0, &s, &len) == 0) g_sink += len ? (uint8_t)s[len - 1] : 0;
        return;
    }
    for (uint64_t j = 0; j < v->n; j++) {
        gguf_value e;
        REQUIRE(gguf_arr_get_value(v, j, &e) == 0);
        REQUIRE(e.type == v->elem_type);
        walk_value(&e, depth + 1);
    }
    gguf_value e;
    REQUIRE(gguf_arr_get_value(v, v->n, &e) == -1); /* one past the end is refused */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    st_error_clear();
    gguf_file *f = gguf_open_buffer(data, size, "fuzz");
    if (!f) {
        REQUIRE(!strncmp(st_error_get(), "fuzz: ", 6));
        return 0;
    }
    REQUIRE(gguf_version(f) == 2 || gguf_version(f) == 3);
    size_t align = gguf_alignment(f);
    REQUIRE(align && !(align & (align - 1)));
    for (int64_t i = 0; i < gguf_n_kv(f); i++) {
        const char *key = gguf_key(f, i);
        REQUIRE(key && gguf_find_key(f, key) == i);
        gguf_value v;
        REQUIRE(gguf_get_value(f, i, &v) == 0 && v.type == gguf_kv_type(f, i));
        walk_value(&v, 0);
        uint32_t u32;
        int64_t i64;
        float f32;
        int b;
        const char *s;
        uint64_t len;
        g_sink += gguf_get_u32(f, key, &u32) + gguf_get_i64(f, key, &i64) + gguf_get_f32(f, key, &f32) +
                  gguf_get_bool(f, key, &b) + gguf_get_str(f, key, &s, &len);
    }
    const uint8_t *end = data + size;
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        REQUIRE(t && gguf_find_tensor(f, t->name) == t);
        REQUIRE(t->n_dims >= 1 && t->n_dims <= GGUF_MAX_DIMS && t->size > 0);
        REQUIRE(t->offset % align == 0);
        const uint8_t *p = t->data;
        REQUIRE(p >= data && t->size <= (uint64_t)(end - p));
        g_sink += p[0] + p[t->size - 1];
    }
    gguf_close(f);
    return 0;
}
