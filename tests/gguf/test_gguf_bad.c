/* Hand-made bad GGUF files: each case builds the bytes of one defect with the
 * byte builder (not with the writer under test), and asserts that gguf_open
 * refuses the file AND that the message names the file and contains the
 * phrase of that defect class. Each case is also opened from an exactly
 * sized heap buffer, so under ASan any read past the end is caught (a mapped
 * file would hide small over-reads inside its last page). Last, a valid small
 * file is cut at every byte: every cut must fail cleanly, never crash.
 */
#include "core/log.h"
#include "gguf/gguf.h"
#include "gguf_test_util.h"

static const char *g_dir;

enum { T_F32 = 0, T_Q4_0 = 2, T_F64 = 28 };
enum { V_U8 = 0, V_I32 = 5, V_U32 = 4, V_BOOL = 7, V_STR = 8, V_ARR = 9 };

/* A valid file: 4 key-values (alignment, a string, a string array, an array
 * of arrays) and two tensors, F32 [8] at 0 and Q4_0 [32, 2] at 32. */
static void good_file(bb *b) {
    bb_header(b, 3, 2, 4);
    bb_kv_u32(b, "general.alignment", 32);
    bb_kv_str(b, "general.name", "tiny");
    bb_key(b, "tok", V_ARR);
    bb_u32(b, V_STR);
    bb_u64(b, 2);
    bb_str(b, "a");
    bb_str(b, "bc");
    bb_key(b, "nest", V_ARR);
    bb_u32(b, V_ARR);
    bb_u64(b, 1);
    bb_u32(b, V_U8);
    bb_u64(b, 1);
    bb_u8(b, 7);
    uint64_t ne_a[1] = {8}, ne_b[2] = {32, 2};
    bb_tinfo(b, "a", 1, ne_a, T_F32, 0);
    bb_tinfo(b, "b", 2, ne_b, T_Q4_0, 32);
    bb_pad(b, 32);
    bb_fill(b, 32, 1);
    bb_fill(b, 36, 2);
}

/* One tensor with the given shape/type/offset and `data` bytes of data. */
static void one_tensor(bb *b, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type, uint64_t offset,
                       size_t data) {
    bb_header(b, 3, 1, 0);
    bb_tinfo(b, name, n_dims, ne, type, offset);
    bb_pad(b, 32);
    bb_fill(b, data, 3);
}

static void two_tensors(bb *b, const char *n1, uint64_t off1, const char *n2, uint64_t off2) {
    uint64_t ne[1] = {8};
    bb_header(b, 3, 2, 0);
    bb_tinfo(b, n1, 1, ne, T_F32, off1);
    bb_tinfo(b, n2, 1, ne, T_F32, off2);
    bb_pad(b, 32);
    bb_fill(b, 96, 4);
}

static void nested(bb *b, int levels) {
    if (levels == 1) {
        bb_u32(b, V_U8);
        bb_u64(b, 1);
        bb_u8(b, 1);
        return;
    }
    bb_u32(b, V_ARR);
    bb_u64(b, 1);
    nested(b, levels - 1);
}

/* ---- the cases ---- */
static void c_trunc_header(bb *b) {
    bb_put(b, "GGUF", 4);
    bb_u32(b, 3);
    bb_u32(b, 0);
}
static void c_empty(bb *b) { (void)b; }
static void c_magic(bb *b) {
    good_file(b);
    b->p[3] = 'X';
}
static void c_v1(bb *b) {
    good_file(b);
    b->p[4] = 1;
}
static void c_v99(bb *b) {
    good_file(b);
    b->p[4] = 99;
}
static void c_bigendian(bb *b) {
    good_file(b);
    b->p[4] = 0;
    b->p[7] = 3;
}
static void c_huge_nkv(bb *b) {
    bb_header(b, 3, 0, 1ull << 60);
    bb_kv_u32(b, "k", 1);
}
static void c_huge_ntensors(bb *b) {
    bb_header(b, 3, 1ull << 60, 0);
    bb_fill(b, 64, 0);
}
static void c_huge_ntensors_after_kv(bb *b) {
    bb_header(b, 3, 3, 1);
    bb_kv_str(b, "k",
              "0123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789");
}
static void c_huge_key_len(bb *b) {
    bb_header(b, 3, 0, 1);
    bb_u64(b, 1ull << 40);
    bb_fill(b, 16, 0);
}
static void c_huge_str(bb *b) {
    bb_header(b, 3, 0, 1);
    bb_key(b, "s", V_STR);
    bb_u64(b, 1ull << 62);
    bb_put(b, "abc", 3);
}
static void c_huge_arr(bb *b) {
    bb_header(b, 3, 0, 1);
    bb_key(b, "a", V_ARR);
    bb_u32(b, V_U32);
    bb_u64(b, 1ull << 61);
    bb_fill(b, 16, 0);
}
static void c_huge_arr_str(bb *b) {
    bb_header(b, 3, 0, 1);
    bb_key(b, "a", V_ARR);
    bb_u32(b, V_STR);
    bb_u64(b, 1000);
    bb_fill(b, 64, 0);
}
static void c_offset_past_end(bb *b) {
    uint64_t ne[1] = {8};
    one_tensor(b, "w", 1, ne, T_F32, 4096, 32);
}
static void c_size_past_end(bb *b) {
    uint64_t ne[1] = {16};
    one_tensor(b, "w", 1, ne, T_F32, 0, 32);
}
static void c_no_data(bb *b) {
    uint64_t ne[1] = {8};
    bb_header(b, 3, 1, 0);
    bb_tinfo(b, "w", 1, ne, T_F32, 0);
}
static void c_misaligned(bb *b) {
    uint64_t ne[1] = {8};
    one_tensor(b, "w", 1, ne, T_F32, 8, 64);
}
static void c_align3(bb *b) {
    bb_header(b, 3, 0, 1);
    bb_kv_u32(b, "general.alignment", 48);
}
static void c_align0(bb *b) {
    bb_header(b, 3, 0, 1);
    bb_kv_u32(b, "general.alignment", 0);
}
static void c_align_type(bb *b) {
    bb_header(b, 3, 0, 1);
    bb_key(b, "general.alignment", V_I32);
    bb_u32(b, 32);
}
static void c_dup_key(bb *b) {
    bb_header(b, 3, 0, 3);
    bb_kv_u32(b, "x", 1);
    bb_kv_u32(b, "y", 1);
    bb_kv_str(b, "x", "z");
}
static void c_dup_tensor(bb *b) { two_tensors(b, "w", 0, "w", 32); }
static void c_overlap(bb *b) { two_tensors(b, "w1", 32, "w2", 32); }
static void c_unknown_ttype(bb *b) {
    uint64_t ne[1] = {8};
    one_tensor(b, "w", 1, ne, 5, 0, 32);
}
static void c_unknown_ttype_big(bb *b) {
    uint64_t ne[1] = {8};
    one_tensor(b, "w", 1, ne, 0xffffffffu, 0, 32);
}
static void c_unknown_vtype(bb *b) {
    bb_header(b, 3, 0, 1);
    bb_key(b, "k", 13);
    bb_u32(b, 0);
}
static void c_unknown_elem_type(bb *b) {
    bb_header(b, 3, 0, 1);
    bb_key(b, "k", V_ARR);
    bb_u32(b, 99);
    bb_u64(b, 0);
}
static void c_key_utf8(bb *b) {
    bb_header(b, 3, 0, 1);
    bb_kv_u32(b, "ab\xff", 1);
}
static void c_key_overlong(bb *b) {
    bb_header(b, 3, 0, 1);
    bb_kv_u32(b, "\xc0\xaf", 1);
}
static void c_key_surrogate(bb *b) {
    bb_header(b, 3, 0, 1);
    bb_kv_u32(b, "\xed\xa0\x80", 1);
}
static void c_key_cut_utf8(bb *b) {
    bb_header(b, 3, 0, 1);
    bb_kv_u32(b, "x\xe2\x9c", 1);
}
static void c_key_nul(bb *b) {
    bb_header(b, 3, 0, 1);
    bb_strn(b, "a\0b", 3);
    bb_u32(b, V_U32);
    bb_u32(b, 1);
}
static void c_key_empty(bb *b) {
    bb_header(b, 3, 0, 1);
    bb_kv_u32(b, "", 1);
}
static void c_tname_utf8(bb *b) {
    uint64_t ne[1] = {8};
    one_tensor(b, "w\x80", 1, ne, T_F32, 0, 32);
}
static void c_ndims0(bb *b) {
    uint64_t ne[1] = {8};
    one_tensor(b, "w", 0, ne, T_F32, 0, 32);
}
static void c_ndims5(bb *b) {
    uint64_t ne[5] = {8, 1, 1, 1, 1};
    one_tensor(b, "w", 5, ne, T_F32, 0, 32);
}
static void c_ne0(bb *b) {
    uint64_t ne[2] = {8, 0};
    one_tensor(b, "w", 2, ne, T_F32, 0, 32);
}
static void c_ne_neg(bb *b) {
    uint64_t ne[2] = {8, 1ull << 63};
    one_tensor(b, "w", 2, ne, T_F32, 0, 32);
}
static void c_ne_overflow(bb *b) {
    uint64_t ne[2] = {1ull << 32, 1ull << 32};
    one_tensor(b, "w", 2, ne, T_F32, 0, 32);
}
static void c_size_overflow(bb *b) {
    uint64_t ne[1] = {1ull << 62};
    one_tensor(b, "w", 1, ne, T_F64, 0, 32);
}
static void c_ne_block(bb *b) {
    uint64_t ne[2] = {33, 2};
    one_tensor(b, "w", 2, ne, T_Q4_0, 0, 64);
}
static void c_deep(bb *b) {
    bb_header(b, 3, 0, 1);
    bb_key(b, "d", V_ARR);
    nested(b, 9);
}
static void c_bool(bb *b) {
    bb_header(b, 3, 0, 1);
    bb_key(b, "b", V_BOOL);
    bb_u8(b, 2);
}
static void c_bool_arr(bb *b) {
    bb_header(b, 3, 0, 1);
    bb_key(b, "b", V_ARR);
    bb_u32(b, V_BOOL);
    bb_u64(b, 3);
    bb_u8(b, 1);
    bb_u8(b, 0);
    bb_u8(b, 3);
}
static void c_trunc_value(bb *b) {
    bb_header(b, 3, 0, 1);
    bb_key(b, "k", V_U32);
    bb_u8(b, 1);
}

typedef struct {
    const char *name;
    void (*build)(bb *);
    const char *phrase;
} bad_case;

static const bad_case k_cases[] = {
    {"empty file", c_empty, "truncated"},
    {"truncated header", c_trunc_header, "truncated: tensor and key-value counts"},
    {"wrong magic", c_magic, "not a GGUF file"},
    {"version 1", c_v1, "GGUF version 1 is not supported"},
    {"version 99", c_v99, "unsupported GGUF version 99"},
    {"big-endian file", c_bigendian, "looks big-endian"},
    {"huge n_kv", c_huge_nkv, "n_kv = 1152921504606846976 key-values cannot fit"},
    {"huge n_tensors", c_huge_ntensors, "n_tensors = 1152921504606846976 tensor infos cannot fit"},
    {"n_tensors too big after metadata", c_huge_ntensors_after_kv, "after the metadata"},
    {"huge key length", c_huge_key_len, "key length 1099511627776 exceeds"},
    {"huge string length", c_huge_str, "string length 4611686018427387904 exceeds"},
    {"huge array length", c_huge_arr, "array length 2305843009213693952 of uint32 exceeds"},
    {"array of strings too long", c_huge_arr_str, "array length 1000 of string exceeds"},
    {"tensor offset past the end", c_offset_past_end, "runs past the end of the file"},
    {"tensor size past the end", c_size_past_end, "runs past the end of the file"},
    {"no data section", c_no_data, "data section would start"},
    {"misaligned tensor offset", c_misaligned, "offset 8 is not a multiple of the alignment 32"},
    {"alignment 48", c_align3, "general.alignment = 48 is not a nonzero power of two"},
    {"alignment 0", c_align0, "general.alignment = 0 is not a nonzero power of two"},
    {"alignment of type int32", c_align_type, "general.alignment has type int32, must be uint32"},
    {"duplicate key", c_dup_key, "duplicate key 'x'"},
    {"duplicate tensor name", c_dup_tensor, "duplicate tensor name 'w'"},
    {"overlapping tensor data", c_overlap, "overlap"},
    {"unknown tensor type 5", c_unknown_ttype, "unknown tensor type 5"},
    {"unknown tensor type 2^32-1", c_unknown_ttype_big, "unknown tensor type 4294967295"},
    {"unknown value type", c_unknown_vtype, "unknown value type 13"},
    {"unknown array element type", c_unknown_elem_type, "unknown value type 99"},
    {"non-UTF-8 key", c_key_utf8, "key is not valid UTF-8"},
    {"overlong UTF-8 key", c_key_overlong, "key is not valid UTF-8"},
    {"surrogate in key", c_key_surrogate, "key is not valid UTF-8"},
    {"cut UTF-8 sequence in key", c_key_cut_utf8, "key is not valid UTF-8"},
    {"NUL in key", c_key_nul, "key contains a NUL byte"},
    {"empty key", c_key_empty, "empty key"},
    {"non-UTF-8 tensor name", c_tname_utf8, "tensor name is not valid UTF-8"},
    {"n_dims 0", c_ndims0, "n_dims = 0, must be 1..4"},
    {"n_dims 5", c_ndims5, "n_dims = 5, must be 1..4"},
    {"ne = 0", c_ne0, "ne[1] = 0 is not positive"},
    {"ne negative", c_ne_neg, "ne[1] = -9223372036854775808 is not positive"},
    {"ne product overflow", c_ne_overflow, "element count overflows"},
    {"byte size overflow", c_size_overflow, "byte size overflows"},
    {"ne[0] not a multiple of the block", c_ne_block, "ne[0] = 33 is not a multiple of the block size 32 of Q4_0"},
    {"arrays nested 9 deep", c_deep, "arrays nested deeper than 8 levels"},
    {"bool value 2", c_bool, "bool value 2 is not 0 or 1"},
    {"bool array element 3", c_bool_arr, "bool value 3 in array"},
    {"value cut short", c_trunc_value, "truncated: uint32 needs 4 bytes"},
};

/* Opens the bytes as a file and as an exact heap buffer; both must fail with
 * the phrase. Returns 1 if everything held. */
static int expect_fail(const char *label, const uint8_t *p, size_t n, const char *phrase) {
    char path[1024];
    snprintf(path, sizeof path, "%s/bad.gguf", g_dir);
    int ok = 1;
    if (write_file(path, p, n)) {
        fprintf(stderr, "cannot write %s\n", path);
        return 0;
    }
    st_error_clear();
    gguf_file *f = gguf_open(path);
    const char *msg = st_error_get();
    char prefix[1100];
    snprintf(prefix, sizeof prefix, "%s: ", path);
    if (f || !strstr(msg, phrase) || strncmp(msg, prefix, strlen(prefix))) {
        fprintf(stderr, "FAIL %s (file): %s; message '%s', wanted '%s'\n", label, f ? "opened" : "refused", msg,
                phrase);
        ok = 0;
    }
    if (f) gguf_close(f);
    if (ok) printf("  ok  %-34s %s\n", label, msg + strlen(prefix));
    uint8_t *copy = malloc(n ? n : 1);
    if (n) memcpy(copy, p, n);
    st_error_clear();
    f = gguf_open_buffer(copy, n, "buf");
    msg = st_error_get();
    if (f || !strstr(msg, phrase) || strncmp(msg, "buf: ", 5)) {
        fprintf(stderr, "FAIL %s (buffer): message '%s'\n", label, msg);
        ok = 0;
    }
    if (f) gguf_close(f);
    free(copy);
    return ok;
}

int main(int argc, char **argv) {
    g_dir = argc > 1 ? argv[1] : ".";
    size_t n_cases = sizeof k_cases / sizeof k_cases[0];
    /* the base of most cases must itself be fine, or the cases prove nothing */
    bb good = {0};
    good_file(&good);
    gguf_file *f = gguf_open_buffer(good.p, good.n, "good");
    CHECK(f != NULL);
    if (f) {
        CHECK(gguf_n_kv(f) == 4 && gguf_n_tensors(f) == 2 && gguf_find_tensor(f, "b")->size == 36);
        gguf_close(f);
    } else {
        fprintf(stderr, "good file refused: %s\n", st_error_get());
    }
    bb b = {0};
    two_tensors(&b, "w1", 32, "w2", 0); /* adjacent, not overlapping: must be fine */
    f = gguf_open_buffer(b.p, b.n, "adjacent");
    CHECK(f != NULL);
    gguf_close(f);
    bb_free(&b);
    printf("  the valid base files open\n");

    for (size_t i = 0; i < n_cases; i++) {
        k_cases[i].build(&b);
        CHECK(expect_fail(k_cases[i].name, b.p, b.n, k_cases[i].phrase));
        bb_free(&b);
    }

    /* every cut of the valid file: fails with a truncation-class message */
    int cut_ok = 0;
    for (size_t k = 0; k < good.n; k++) {
        uint8_t *copy = malloc(k ? k : 1);
        memcpy(copy, good.p, k);
        st_error_clear();
        f = gguf_open_buffer(copy, k, "cut");
        const char *msg = st_error_get();
        int ok = !f && (strstr(msg, "truncated") || strstr(msg, "exceeds") || strstr(msg, "cannot fit") ||
                        strstr(msg, "past the end"));
        if (!ok) fprintf(stderr, "FAIL cut at %zu: %s\n", k, f ? "opened" : msg);
        if (f) gguf_close(f);
        free(copy);
        /* the same through gguf_open (mmap; an empty file is not mapped at all) */
        char path[1024];
        snprintf(path, sizeof path, "%s/cut.gguf", g_dir);
        if (write_file(path, good.p, k) == 0 && (f = gguf_open(path)) != NULL) {
            fprintf(stderr, "FAIL cut at %zu: gguf_open accepted it\n", k);
            gguf_close(f);
            ok = 0;
        }
        cut_ok += ok;
    }
    CHECK(cut_ok == (int)good.n);
    printf("  ok  the valid %zu-byte file cut at each of its %zu bytes: all refused cleanly\n", good.n, good.n);
    bb_free(&good);
    printf("test_gguf_bad: %zu defect classes, %d checks, %d failed\n", n_cases, g_checks, g_fail);
    return g_fail ? 1 : 0;
}
