/* GGUF round trip: the writer writes a file with every metadata type (scalars
 * of all 12 kinds, strings with UTF-8 and an embedded NUL, flat arrays of each
 * scalar type, string arrays, empty arrays, arrays of arrays nested to the
 * maximum depth) and tensors of seven types; the reader reads it back (from
 * the file and from a buffer, as version 3 and patched to version 2) and every
 * value, shape, offset and data byte is compared with what was written.
 * Expected sizes and offsets come from the GGUF spec (bytes per block), not
 * from the code under test. Also: writer refusals, and lookup speed on a
 * 200k-entry string array and 5000 tensors.
 */
#include <math.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "core/log.h"
#include "gguf/gguf.h"
#include "gguf_test_util.h"

typedef struct {
    const char *name;
    int type, n_dims;
    int64_t ne[4];
    uint64_t bytes; /* from the spec: blocks * bytes per block */
} tspec;

static const tspec k_tensors[] = {
    {"tok_embd.weight", 0 /*F32*/, 2, {4, 3, 1, 1}, 4 * 3 * 4},
    {"output_norm", 1 /*F16*/, 1, {8, 1, 1, 1}, 8 * 2},
    {"blk.0.attn_q.weight", 2 /*Q4_0*/, 2, {64, 2, 1, 1}, 2 * 2 * 18},
    {"blk.0.ffn_up.weight", 8 /*Q8_0*/, 4, {32, 1, 1, 2}, 2 * 34},
    {"blk.0.ffn_down.weight", 12 /*Q4_K*/, 2, {256, 3, 1, 1}, 3 * 144},
    {"ids", 26 /*I32*/, 1, {5, 1, 1, 1}, 5 * 4},
    {"\xc3\xbc-\xe5\x90\x8d\xe5\x89\x8d", 30 /*BF16*/, 2, {2, 2, 1, 1}, 8},
};
#define N_T (int)(sizeof k_tensors / sizeof k_tensors[0])

static uint8_t pattern(int64_t i, size_t j) { return (uint8_t)(i * 37 + j * 11 + (j >> 8)); }

static int fill_pattern(void *ctx, int64_t i, void *buf, size_t size) {
    (void)ctx;
    for (size_t j = 0; j < size; j++) ((uint8_t *)buf)[j] = pattern(i, j);
    return 0;
}

#define N_VOCAB 200000
static const char *k_strs[] = {"", "a", "\xc3\x9f", "a longer string with spaces and \xe2\x9c\x93"};

/* raw encodings for gguf_w_raw, made by hand with the byte builder */
static void raw_nested(bb *b, int levels) { /* levels arrays deep, innermost holds u8 [42, 43] */
    if (levels == 1) {
        bb_u32(b, 0);
        bb_u64(b, 2);
        bb_u8(b, 42);
        bb_u8(b, 43);
        return;
    }
    bb_u32(b, 9);
    bb_u64(b, 1);
    raw_nested(b, levels - 1);
}

static void write_all_types(const char *path, uint32_t align) {
    gguf_writer *w = gguf_writer_new();
    if (align) gguf_writer_set_alignment(w, align);
    gguf_w_u32(w, "t.u32", 0xDEADBEEFu);
    gguf_w_i32(w, "t.i32", -123456);
    gguf_w_u64(w, "t.u64", 0x123456789ABCDEF0ull);
    gguf_w_f32(w, "t.f32", 3.25f);
    gguf_w_bool(w, "t.true", 1);
    gguf_w_bool(w, "t.false", 0);
    gguf_w_str(w, "t.str", "h\xc3\xa9llo w\xc3\xb6rld \xe2\x9c\x93");
    uint8_t u8 = 200;
    int8_t i8 = -7;
    uint16_t u16 = 65000;
    int16_t i16 = -30000;
    int64_t i64 = -9000000000000000000ll;
    double f64 = 2.718281828459045;
    gguf_w_raw(w, "t.u8", GGUF_T_UINT8, &u8, 1);
    gguf_w_raw(w, "t.i8", GGUF_T_INT8, &i8, 1);
    gguf_w_raw(w, "t.u16", GGUF_T_UINT16, &u16, 2);
    gguf_w_raw(w, "t.i16", GGUF_T_INT16, &i16, 2);
    gguf_w_raw(w, "t.i64", GGUF_T_INT64, &i64, 8);
    gguf_w_raw(w, "t.f64", GGUF_T_FLOAT64, &f64, 8);
    bb s = {0};
    bb_strn(&s, "a\0b", 3);
    gguf_w_raw(w, "t.str_nul", GGUF_T_STRING, s.p, s.n);
    bb_free(&s);
    uint8_t au8[] = {1, 2, 255};
    int32_t ai32[] = {-1, 0, 7};
    float af32[] = {0.5f, -2.0f};
    uint8_t abool[] = {1, 0, 1};
    uint64_t au64[] = {(1ull << 63) + 5, 1};
    double af64[] = {1e300, -0.0};
    int16_t ai16[] = {-2, 3};
    gguf_w_arr(w, "a.u8", GGUF_T_UINT8, au8, 3);
    gguf_w_arr(w, "a.i32", GGUF_T_INT32, ai32, 3);
    gguf_w_arr(w, "a.f32", GGUF_T_FLOAT32, af32, 2);
    gguf_w_arr(w, "a.bool", GGUF_T_BOOL, abool, 3);
    gguf_w_arr(w, "a.u64", GGUF_T_UINT64, au64, 2);
    gguf_w_arr(w, "a.f64", GGUF_T_FLOAT64, af64, 2);
    gguf_w_arr(w, "a.i16", GGUF_T_INT16, ai16, 2);
    gguf_w_arr(w, "a.empty", GGUF_T_UINT32, NULL, 0);
    gguf_w_arr_str(w, "a.str", k_strs, 4);
    gguf_w_arr_str(w, "a.str_empty", NULL, 0);
    /* array of arrays: [[10,20,30] i32, ["x","yz"], [] u8] */
    bb a = {0};
    bb_u32(&a, 9);
    bb_u64(&a, 3);
    bb_u32(&a, 5);
    bb_u64(&a, 3);
    bb_u32(&a, 10);
    bb_u32(&a, 20);
    bb_u32(&a, 30);
    bb_u32(&a, 8);
    bb_u64(&a, 2);
    bb_str(&a, "x");
    bb_str(&a, "yz");
    bb_u32(&a, 0);
    bb_u64(&a, 0);
    gguf_w_raw(w, "a.nested", GGUF_T_ARRAY, a.p, a.n);
    bb_free(&a);
    raw_nested(&a, 8); /* the deepest nesting the reader accepts */
    gguf_w_raw(w, "a.deep", GGUF_T_ARRAY, a.p, a.n);
    bb_free(&a);
    char **vocab = malloc(N_VOCAB * sizeof *vocab);
    for (int i = 0; i < N_VOCAB; i++) {
        vocab[i] = malloc(16);
        snprintf(vocab[i], 16, "tok%d", i);
    }
    gguf_w_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)vocab, N_VOCAB);
    for (int i = 0; i < N_VOCAB; i++) free(vocab[i]);
    free(vocab);
    for (int i = 0; i < N_T; i++)
        gguf_w_tensor(w, k_tensors[i].name, k_tensors[i].type, k_tensors[i].n_dims, k_tensors[i].ne);
    int rc = gguf_writer_write(w, path, fill_pattern, NULL);
    if (rc) fprintf(stderr, "write: %s\n", st_error_get());
    CHECK(rc == 0);
    gguf_writer_free(w);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void check_scalars(const gguf_file *f) {
    uint32_t u32;
    int64_t i64;
    float f32;
    int b;
    const char *s;
    uint64_t len;
    double d;
    CHECK(gguf_get_u32(f, "t.u32", &u32) == 0 && u32 == 0xDEADBEEFu);
    CHECK(gguf_get_i64(f, "t.i32", &i64) == 0 && i64 == -123456);
    CHECK(gguf_get_u32(f, "t.i32", &u32) == -1); /* negative does not fit */
    CHECK(gguf_get_i64(f, "t.u64", &i64) == 0 && i64 == 0x123456789ABCDEF0ll);
    CHECK(gguf_get_u32(f, "t.u64", &u32) == -1); /* too big for u32 */
    CHECK(gguf_get_f32(f, "t.f32", &f32) == 0 && f32 == 3.25f);
    CHECK(gguf_get_f32(f, "t.u32", &f32) == -1);
    CHECK(gguf_get_bool(f, "t.true", &b) == 0 && b == 1);
    CHECK(gguf_get_bool(f, "t.false", &b) == 0 && b == 0);
    CHECK(gguf_get_bool(f, "t.u8", &b) == -1);
    CHECK(gguf_get_str(f, "t.str", &s, &len) == 0 && len == 17 &&
          !memcmp(s, "h\xc3\xa9llo w\xc3\xb6rld \xe2\x9c\x93", 17));
    CHECK(gguf_get_str(f, "t.str_nul", &s, &len) == 0 && len == 3 && !memcmp(s, "a\0b", 3));
    CHECK(gguf_get_str(f, "t.u32", &s, &len) == -1);
    CHECK(gguf_get_u32(f, "t.u8", &u32) == 0 && u32 == 200);
    CHECK(gguf_get_i64(f, "t.i8", &i64) == 0 && i64 == -7);
    CHECK(gguf_get_u32(f, "t.u16", &u32) == 0 && u32 == 65000);
    CHECK(gguf_get_i64(f, "t.i16", &i64) == 0 && i64 == -30000);
    CHECK(gguf_get_i64(f, "t.i64", &i64) == 0 && i64 == -9000000000000000000ll);
    CHECK(gguf_get_f32(f, "t.f64", &f32) == 0 && f32 == (float)2.718281828459045);
    gguf_value v;
    CHECK(gguf_get_value(f, gguf_find_key(f, "t.f64"), &v) == 0 && v.type == GGUF_T_FLOAT64 && v.n == 1);
    CHECK(gguf_arr_get_f64(&v, 0, &d) == 0 && d == 2.718281828459045);
    CHECK(gguf_arr_get_f64(&v, 1, &d) == -1);
    CHECK(gguf_find_key(f, "absent") == -1 && gguf_get_u32(f, "absent", &u32) == -1);
    CHECK(gguf_key(f, -1) == NULL && gguf_key(f, gguf_n_kv(f)) == NULL);
}

static void check_arrays(const gguf_file *f) {
    gguf_value v, e, e2;
    int64_t i;
    double d;
    const char *s;
    uint64_t len;
    CHECK(gguf_get_value(f, gguf_find_key(f, "a.u8"), &v) == 0 && v.type == GGUF_T_ARRAY &&
          v.elem_type == GGUF_T_UINT8 && v.n == 3);
    CHECK(gguf_arr_get_i64(&v, 2, &i) == 0 && i == 255 && gguf_arr_get_i64(&v, 3, &i) == -1);
    CHECK(gguf_get_value(f, gguf_find_key(f, "a.i32"), &v) == 0 && v.elem_type == GGUF_T_INT32 && v.n == 3);
    CHECK(gguf_arr_get_i64(&v, 0, &i) == 0 && i == -1 && gguf_arr_get_i64(&v, 2, &i) == 0 && i == 7);
    CHECK(gguf_get_value(f, gguf_find_key(f, "a.f32"), &v) == 0 && v.elem_type == GGUF_T_FLOAT32 && v.n == 2);
    CHECK(gguf_arr_get_f64(&v, 1, &d) == 0 && d == -2.0 && gguf_arr_get_i64(&v, 0, &i) == -1);
    CHECK(gguf_get_value(f, gguf_find_key(f, "a.bool"), &v) == 0 && v.elem_type == GGUF_T_BOOL && v.n == 3);
    CHECK(gguf_arr_get_i64(&v, 0, &i) == 0 && i == 1 && gguf_arr_get_i64(&v, 1, &i) == 0 && i == 0);
    CHECK(gguf_get_value(f, gguf_find_key(f, "a.u64"), &v) == 0 && v.elem_type == GGUF_T_UINT64 && v.n == 2);
    CHECK(gguf_arr_get_i64(&v, 0, &i) == -1); /* 2^63 + 5 does not fit int64 */
    CHECK(gguf_arr_get_f64(&v, 0, &d) == 0 && d == 9223372036854775813.0);
    CHECK(gguf_get_value(f, gguf_find_key(f, "a.f64"), &v) == 0 && v.elem_type == GGUF_T_FLOAT64);
    CHECK(gguf_arr_get_f64(&v, 0, &d) == 0 && d == 1e300 && gguf_arr_get_f64(&v, 1, &d) == 0 && d == 0 && signbit(d));
    CHECK(gguf_get_value(f, gguf_find_key(f, "a.i16"), &v) == 0 && gguf_arr_get_i64(&v, 0, &i) == 0 && i == -2);
    CHECK(gguf_get_value(f, gguf_find_key(f, "a.empty"), &v) == 0 && v.elem_type == GGUF_T_UINT32 && v.n == 0);
    CHECK(gguf_arr_get_i64(&v, 0, &i) == -1);
    CHECK(gguf_get_value(f, gguf_find_key(f, "a.str"), &v) == 0 && v.elem_type == GGUF_T_STRING && v.n == 4);
    for (uint64_t j = 0; j < 4; j++)
        CHECK(gguf_arr_get_str(&v, j, &s, &len) == 0 && len == strlen(k_strs[j]) && !memcmp(s, k_strs[j], len));
    CHECK(gguf_arr_get_i64(&v, 0, &i) == -1 && gguf_arr_get_str(&v, 4, &s, &len) == -1);
    CHECK(gguf_get_value(f, gguf_find_key(f, "a.str_empty"), &v) == 0 && v.elem_type == GGUF_T_STRING && v.n == 0);
    /* array of arrays */
    CHECK(gguf_get_value(f, gguf_find_key(f, "a.nested"), &v) == 0 && v.elem_type == GGUF_T_ARRAY && v.n == 3);
    CHECK(gguf_arr_get_value(&v, 0, &e) == 0 && e.type == GGUF_T_ARRAY && e.elem_type == GGUF_T_INT32 && e.n == 3);
    CHECK(gguf_arr_get_i64(&e, 1, &i) == 0 && i == 20 && gguf_arr_get_i64(&e, 2, &i) == 0 && i == 30);
    CHECK(gguf_arr_get_value(&v, 1, &e) == 0 && e.elem_type == GGUF_T_STRING && e.n == 2);
    CHECK(gguf_arr_get_str(&e, 1, &s, &len) == 0 && len == 2 && !memcmp(s, "yz", 2));
    CHECK(gguf_arr_get_value(&v, 2, &e) == 0 && e.elem_type == GGUF_T_UINT8 && e.n == 0);
    CHECK(gguf_arr_get_value(&v, 3, &e) == -1);
    CHECK(gguf_arr_get_str(&v, 0, &s, &len) == -1); /* elements are arrays, not strings */
    /* the same elements through the walk path (no index), as a hand-made value would have */
    gguf_value w = v;
    w.elem_off = NULL;
    CHECK(gguf_arr_get_value(&w, 1, &e) == 0 && e.n == 2 && gguf_arr_get_str(&e, 0, &s, &len) == 0 && len == 1 &&
          s[0] == 'x');
    CHECK(gguf_arr_get_value(&w, 2, &e) == 0 && e.elem_type == GGUF_T_UINT8 && e.n == 0);
    /* eight levels deep */
    CHECK(gguf_get_value(f, gguf_find_key(f, "a.deep"), &v) == 0);
    e = v;
    int depth = 1;
    while (e.elem_type == GGUF_T_ARRAY && gguf_arr_get_value(&e, 0, &e2) == 0) e = e2, depth++;
    CHECK(depth == 8 && e.elem_type == GGUF_T_UINT8 && e.n == 2 && gguf_arr_get_i64(&e, 1, &i) == 0 && i == 43);
}

static void check_vocab(const gguf_file *f) {
    gguf_value v;
    const char *s;
    uint64_t len;
    CHECK(gguf_get_value(f, gguf_find_key(f, "tokenizer.ggml.tokens"), &v) == 0 && v.n == N_VOCAB &&
          v.elem_off != NULL);
    double t0 = now_s();
    int bad = 0;
    char want[16];
    for (uint64_t k = 0; k < 3 * (uint64_t)N_VOCAB; k++) {
        uint64_t j = k < N_VOCAB ? k : (k * 2654435761u) % N_VOCAB; /* sequential, then scattered */
        snprintf(want, sizeof want, "tok%d", (int)j);
        if (gguf_arr_get_str(&v, j, &s, &len) || len != strlen(want) || memcmp(s, want, len)) bad++;
    }
    double dt = now_s() - t0;
    CHECK(bad == 0);
    CHECK(dt < 2.0); /* an O(j) walk per element would take minutes */
    printf("  %d vocab strings read 3x (sequential + scattered) in %.1f ms\n", N_VOCAB, dt * 1e3);
}

static void check_tensors(const gguf_file *f, uint32_t align) {
    CHECK(gguf_n_tensors(f) == N_T);
    CHECK(gguf_alignment(f) == align);
    CHECK(gguf_data_offset(f) % align == 0);
    uint64_t off = 0;
    for (int i = 0; i < N_T; i++) {
        const tspec *ts = &k_tensors[i];
        const gguf_tensor *t = gguf_tensor_at(f, i);
        CHECK(t && !strcmp(t->name, ts->name) && t->type == ts->type && t->n_dims == ts->n_dims);
        if (!t) continue;
        for (int d = 0; d < 4; d++) CHECK(t->ne[d] == ts->ne[d]);
        CHECK(t->size == ts->bytes);
        CHECK(t->offset == off);
        off = (off + ts->bytes + align - 1) / align * align;
        int bad = 0;
        for (size_t j = 0; j < t->size; j++) bad += ((const uint8_t *)t->data)[j] != pattern(i, j);
        CHECK(bad == 0);
        CHECK(gguf_find_tensor(f, ts->name) == t);
    }
    CHECK(gguf_file_size(f) == gguf_data_offset(f) + off);
    CHECK(gguf_find_tensor(f, "absent") == NULL && gguf_tensor_at(f, N_T) == NULL);
}

static void check_file(const gguf_file *f, uint32_t align, uint32_t version) {
    CHECK(gguf_version(f) == version);
    CHECK(gguf_n_kv(f) == 27 + (align != 32));
    check_scalars(f);
    check_arrays(f);
    check_vocab(f);
    check_tensors(f, align);
    /* keys keep their written order */
    CHECK(!strcmp(gguf_key(f, align != 32 ? 1 : 0), "t.u32"));
    CHECK(gguf_kv_type(f, gguf_find_key(f, "a.nested")) == GGUF_T_ARRAY);
}

static int fill_fail(void *ctx, int64_t i, void *buf, size_t size) {
    (void)ctx;
    (void)buf;
    (void)size;
    return i == 1 ? -1 : 0;
}

static void expect_write_error(gguf_writer *w, const char *path, const char *phrase) {
    int rc = gguf_writer_write(w, path, fill_pattern, NULL);
    int ok = rc == -1 && strstr(st_error_get(), phrase);
    CHECK(ok);
    if (!ok) fprintf(stderr, "  expected '%s', got rc %d: %s\n", phrase, rc, st_error_get());
    FILE *fp = fopen(path, "rb");
    CHECK(fp == NULL); /* nothing left behind */
    if (fp) fclose(fp);
    gguf_writer_free(w);
}

static void check_writer_errors(const char *path) {
    remove(path);
    gguf_writer *w = gguf_writer_new();
    gguf_w_u32(w, "k", 1);
    gguf_w_str(w, "k", "again");
    expect_write_error(w, path, "duplicate key 'k'");
    w = gguf_writer_new();
    int64_t ne[2] = {33, 1};
    gguf_w_tensor(w, "q", 2, 2, ne);
    expect_write_error(w, path, "not a multiple of the block size");
    w = gguf_writer_new();
    ne[0] = 32;
    gguf_w_tensor(w, "q", 2, 2, ne);
    gguf_w_tensor(w, "q", 2, 2, ne);
    expect_write_error(w, path, "duplicate tensor name");
    w = gguf_writer_new();
    gguf_w_tensor(w, "q", 5, 2, ne);
    expect_write_error(w, path, "unknown tensor type 5");
    w = gguf_writer_new();
    gguf_writer_set_alignment(w, 48);
    expect_write_error(w, path, "power of two");
    w = gguf_writer_new();
    gguf_w_u32(w, "\xff", 1);
    expect_write_error(w, path, "not valid UTF-8");
    w = gguf_writer_new();
    uint8_t badraw[12] = {9}; /* an array of 255 arrays in 0 bytes */
    badraw[4] = 0xff;
    gguf_w_raw(w, "r", GGUF_T_ARRAY, badraw, sizeof badraw);
    expect_write_error(w, path, "malformed array value");
    w = gguf_writer_new();
    gguf_w_tensor(w, "a", 0, 1, ne);
    gguf_w_tensor(w, "b", 0, 1, ne);
    CHECK(gguf_writer_write(w, path, fill_fail, NULL) == -1 &&
          strstr(st_error_get(), "fill callback failed for tensor 'b'"));
    CHECK(fopen(path, "rb") == NULL);
    gguf_writer_free(w);
    printf("  writer refuses: duplicate key, bad block multiple, duplicate tensor, unknown type, bad alignment, "
           "non-UTF-8 key, malformed raw value, failing fill\n");
}

static int fill_zero(void *ctx, int64_t i, void *buf, size_t size) {
    (void)ctx;
    memset(buf, 0, size);
    if (size >= 8) memcpy(buf, &i, 8);
    return 0;
}

static void check_many_tensors(const char *path) {
    enum { N = 5000 };
    gguf_writer *w = gguf_writer_new();
    char name[64];
    int64_t ne[1] = {2};
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof name, "blk.%d.ffn_gate_exps.weight", i);
        gguf_w_tensor(w, name, 0, 1, ne);
    }
    CHECK(gguf_writer_write(w, path, fill_zero, NULL) == 0);
    gguf_writer_free(w);
    double t0 = now_s();
    gguf_file *f = gguf_open(path);
    double t1 = now_s();
    CHECK(f != NULL);
    if (!f) return;
    int bad = 0;
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof name, "blk.%d.ffn_gate_exps.weight", i);
        const gguf_tensor *t = gguf_find_tensor(f, name);
        int64_t id;
        if (!t) {
            bad++;
            continue;
        }
        memcpy(&id, t->data, 8);
        bad += id != i || t != gguf_tensor_at(f, i);
    }
    double t2 = now_s();
    CHECK(bad == 0);
    printf("  %d tensors: open %.2f ms, %d lookups %.2f ms\n", N, (t1 - t0) * 1e3, N, (t2 - t1) * 1e3);
    gguf_close(f);
}

static long minor_faults(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_minflt;
}

/* Faults taken reading one byte of every page of tensor t's data. */
static long faults_reading(const gguf_tensor *t, volatile unsigned *sink) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const long f0 = minor_faults();
    for (size_t o = 0; o < t->size; o += page) *sink += ((const unsigned char *)t->data)[o];
    return minor_faults() - f0;
}

/* gguf_populate maps a file's pages in at once: reading the data after it
 * takes (nearly) no page faults, where the same read of a fresh mapping
 * takes one per page or per fault-around group (the check that the count
 * can tell). Refused (1) when more is to read than max_read allows. */
static void check_populate(const char *path) {
    int64_t ne[1] = {(int64_t)16 << 20}; /* 64 MiB of F32 */
    gguf_writer *w = gguf_writer_new();
    gguf_w_tensor(w, "big", 0, 1, ne);
    CHECK(gguf_writer_write(w, path, fill_zero, NULL) == 0);
    gguf_writer_free(w);
    volatile unsigned sink = 0;
    gguf_file *f = gguf_open(path);
    CHECK(f != NULL);
    if (!f) return;
    const gguf_tensor *t = gguf_find_tensor(f, "big");
    const long plain = faults_reading(t, &sink);
    gguf_close(f);
    f = gguf_open(path);
    t = gguf_find_tensor(f, "big");
    size_t to_read = 1;
    const int rc = gguf_populate(f, (size_t)1 << 40, &to_read);
    if (rc < 0) {
        printf("  SKIP populate: %s\n", st_error_get());
        gguf_close(f);
        return;
    }
    const long after = faults_reading(t, &sink);
    CHECK(rc == 0 && to_read <= gguf_file_size(f));
    CHECK(plain >= 8); /* at most 8 MiB per fault (4 KiB pages, 64 KiB fault-around, 2 MiB folios) */
    CHECK(after * 20 <= plain);
    printf("  64 MiB read page by page: %ld faults from a fresh mapping, %ld after gguf_populate\n", plain, after);
    gguf_close(f);
}

/* A 126 GB file with 3000 tensors, as a sparse file (header written, the rest
 * a hole): opening must cost header work only, never a pass over the data. */
static void check_big_sparse(const char *path) {
    enum { N = 3000 };
    const uint64_t ne0 = 4096, ne1 = 5120, bytes = ne0 * ne1 * 2; /* F16 */
    bb b = {0};
    bb_header(&b, 3, N, 1);
    bb_kv_str(&b, "general.architecture", "big");
    char name[64];
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof name, "blk.%d.ffn_down_exps.weight", i);
        uint64_t ne[2] = {ne0, ne1};
        bb_tinfo(&b, name, 2, ne, 1, (uint64_t)i * bytes);
    }
    bb_pad(&b, 32);
    uint64_t total = b.n + (uint64_t)N * bytes;
    FILE *fp = fopen(path, "wb");
    int ok = fp && fwrite(b.p, 1, b.n, fp) == b.n && fflush(fp) == 0 && ftruncate(fileno(fp), (off_t)total) == 0;
    if (fp) fclose(fp);
    bb_free(&b);
    if (!ok) {
        printf("  SKIP big sparse file: this file system cannot make a %.0f GB sparse file\n", total / 1e9);
        remove(path);
        return;
    }
    double t0 = now_s();
    gguf_file *f = gguf_open(path);
    double dt = now_s() - t0;
    CHECK(f != NULL);
    if (f) {
        CHECK(gguf_n_tensors(f) == N && gguf_file_size(f) == total);
        const gguf_tensor *t = gguf_find_tensor(f, "blk.2999.ffn_down_exps.weight");
        CHECK(t && t->offset == 2999ull * bytes && t->size == bytes);
        gguf_close(f);
    }
    CHECK(dt < 1.0);
    printf("  %.1f GB sparse file with %d tensors opened in %.2f ms\n", total / 1e9, N, dt * 1e3);
    f = gguf_open(path); /* nothing of it is in memory: populating it would read 126 GB */
    size_t to_read = 0;
    CHECK(f && gguf_populate(f, (size_t)1 << 30, &to_read) == 1 && to_read > ((size_t)1 << 30));
    printf("  populating it refused: %.1f GB to read\n", to_read / 1e9);
    gguf_close(f);
    remove(path);
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : ".";
    char path[1024], path2[1024];
    snprintf(path, sizeof path, "%s/rw_all_types.gguf", dir);
    snprintf(path2, sizeof path2, "%s/rw_tmp.gguf", dir);

    const uint32_t aligns[2] = {32, 64};
    for (int k = 0; k < 2; k++) {
        uint32_t align = aligns[k];
        write_all_types(path, align == 32 ? 0 : align);
        gguf_file *f = gguf_open(path);
        if (!f) fprintf(stderr, "open: %s\n", st_error_get());
        CHECK(f != NULL);
        if (!f) break;
        check_file(f, align, 3);
        gguf_close(f);
        printf("  alignment %u: every metadata type, %d tensors read back from file\n", align, N_T);

        /* the same bytes from a buffer, then patched to version 2 (same layout) */
        size_t n = 0;
        uint8_t *buf = read_file(path, &n);
        CHECK(buf != NULL);
        f = gguf_open_buffer(buf, n, "mem");
        CHECK(f != NULL);
        if (f) check_file(f, align, 3), gguf_close(f);
        buf[4] = 2;
        f = gguf_open_buffer(buf, n, "mem-v2");
        CHECK(f != NULL);
        if (f) check_file(f, align, 2), gguf_close(f);
        free(buf);
        printf("  alignment %u: same from a buffer, and as version 2\n", align);
    }
    check_writer_errors(path2);
    check_many_tensors(path2);
    check_populate(path2);
    check_big_sparse(path2);
    remove(path2);
    printf("test_gguf_rw: %d checks, %d failed\n", g_checks, g_fail);
    return g_fail ? 1 : 0;
}
