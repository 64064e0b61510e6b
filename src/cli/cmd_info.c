/* `strata info FILE`: what is in a GGUF file, for people and for scripts.
 *
 * Prints the header facts, every metadata key with its type and value (long
 * arrays and strings abbreviated, so a 150k-token vocabulary is one line), the
 * tensors (the first 20 unless --tensors), and a summary per tensor class:
 * the name without its block number ("blk.7.ffn_down_exps.weight" ->
 * "ffn_down_exps"), with count, types, parameters, bytes and bits per weight.
 * That last table is the one that answers "where do the bytes of this model
 * go", which is what placement decisions start from. --json prints the same
 * as one JSON object.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "core/alloc.h"
#include "core/log.h"
#include "gguf/gguf.h"
#include "model/synth.h"
#include "quant/quant.h"

static const char USAGE[] = "strata info FILE [--tensors] [--json]";

#define DEFAULT_TENSORS 20
#define ARRAY_HEAD      6   /* array elements shown */
#define STR_MAX_TEXT    60  /* string characters shown in text mode */
#define STR_MAX_JSON    512 /* in JSON mode */

static const char *vtype_name(gguf_vtype t) {
    static const char *const names[GGUF_T_COUNT] = {"u8",   "i8",  "u16", "i16", "u32", "i32", "f32",
                                                    "bool", "str", "arr", "u64", "i64", "f64"};
    return (unsigned)t < GGUF_T_COUNT ? names[t] : "?";
}

static const char *type_name(int t) {
    const qt_traits *tr = qt_get((qt_type)t);
    return tr ? tr->name : "?";
}

/* A string, escaped for text or JSON, cut at max bytes. */
static void put_str(const char *s, uint64_t len, uint64_t max, int json) {
    putchar('"');
    uint64_t n = len < max ? len : max;
    for (uint64_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\') printf("\\%c", ch);
        else if (ch == '\n') fputs("\\n", stdout);
        else if (ch == '\t') fputs("\\t", stdout);
        else if (ch == '\r') fputs("\\r", stdout);
        else if (ch < 0x20 || ch == 0x7f) printf(json ? "\\u%04x" : "\\x%02x", ch);
        else putchar(ch);
    }
    putchar('"');
    if (n < len && !json) printf("...(%" PRIu64 " bytes)", len);
}

/* One scalar array element or value. */
static void put_elem(const gguf_value *v, uint64_t j, gguf_vtype et, int json) {
    const char *s;
    uint64_t len;
    int64_t iv;
    double dv;
    if (et == GGUF_T_STRING) {
        if (gguf_arr_get_str(v, j, &s, &len) == 0) put_str(s, len, json ? STR_MAX_JSON : STR_MAX_TEXT, json);
        else fputs("null", stdout);
    } else if (et == GGUF_T_FLOAT32 || et == GGUF_T_FLOAT64) {
        if (gguf_arr_get_f64(v, j, &dv) == 0) printf("%.9g", dv);
        else fputs("null", stdout);
    } else if (et == GGUF_T_ARRAY) {
        gguf_value sub;
        if (gguf_arr_get_value(v, j, &sub) == 0) printf(json ? "{\"n\": %" PRIu64 "}" : "[%" PRIu64 " items]", sub.n);
        else fputs("null", stdout);
    } else if (et == GGUF_T_BOOL) {
        if (gguf_arr_get_i64(v, j, &iv) == 0) fputs(iv ? "true" : "false", stdout);
        else fputs("null", stdout);
    } else if (et == GGUF_T_UINT64 && gguf_arr_get_i64(v, j, &iv) != 0) {
        fputs(json ? "null" : "(>int64)", stdout);
    } else {
        if (gguf_arr_get_i64(v, j, &iv) == 0) printf("%" PRId64, iv);
        else fputs("null", stdout);
    }
}

/* A scalar value: read straight from its bytes. */
static void put_scalar(const gguf_file *f, int64_t k, const gguf_value *v, int json) {
    const uint8_t *p = v->raw;
    switch (v->type) {
    case GGUF_T_UINT8: printf("%u", p[0]); break;
    case GGUF_T_INT8: printf("%d", (int8_t)p[0]); break;
    case GGUF_T_UINT16: {
        uint16_t x;
        memcpy(&x, p, 2);
        printf("%u", x);
    } break;
    case GGUF_T_INT16: {
        int16_t x;
        memcpy(&x, p, 2);
        printf("%d", x);
    } break;
    case GGUF_T_UINT32: {
        uint32_t x;
        memcpy(&x, p, 4);
        printf("%" PRIu32, x);
    } break;
    case GGUF_T_INT32: {
        int32_t x;
        memcpy(&x, p, 4);
        printf("%" PRId32, x);
    } break;
    case GGUF_T_UINT64: {
        uint64_t x;
        memcpy(&x, p, 8);
        printf("%" PRIu64, x);
    } break;
    case GGUF_T_INT64: {
        int64_t x;
        memcpy(&x, p, 8);
        printf("%" PRId64, x);
    } break;
    case GGUF_T_FLOAT32: {
        float x;
        memcpy(&x, p, 4);
        printf("%.9g", x);
    } break;
    case GGUF_T_FLOAT64: {
        double x;
        memcpy(&x, p, 8);
        printf("%.17g", x);
    } break;
    case GGUF_T_BOOL: fputs(p[0] ? "true" : "false", stdout); break;
    case GGUF_T_STRING: {
        const char *s;
        uint64_t len;
        if (gguf_get_str(f, gguf_key(f, k), &s, &len) == 0) put_str(s, len, json ? STR_MAX_JSON : STR_MAX_TEXT, json);
        else fputs("null", stdout);
    } break;
    default: fputs("null", stdout);
    }
}

static void put_metadata(const gguf_file *f, int json) {
    int64_t n = gguf_n_kv(f);
    if (!json) printf("metadata (%" PRId64 " keys):\n", n);
    for (int64_t k = 0; k < n; k++) {
        gguf_value v;
        const char *key = gguf_key(f, k);
        if (gguf_get_value(f, k, &v) != 0) continue;
        if (json) {
            printf("%s\n    {\"key\": ", k ? "," : "");
            put_str(key, strlen(key), STR_MAX_JSON, 1);
        } else {
            printf("  %-44s ", key);
        }
        if (v.type == GGUF_T_ARRAY) {
            uint64_t show = v.n < ARRAY_HEAD ? v.n : ARRAY_HEAD;
            if (json)
                printf(", \"type\": \"arr\", \"elem_type\": \"%s\", \"n\": %" PRIu64 ", \"head\": [",
                       vtype_name(v.elem_type), v.n);
            else printf("arr[%s,%" PRIu64 "]%*s[", vtype_name(v.elem_type), v.n, 2, "");
            for (uint64_t j = 0; j < show; j++) {
                if (j) fputs(", ", stdout);
                put_elem(&v, j, v.elem_type, json);
            }
            if (!json && show < v.n) fputs(", ...", stdout);
            fputs(json ? "]}" : "]\n", stdout);
        } else {
            if (json) printf(", \"type\": \"%s\", \"value\": ", vtype_name(v.type));
            else printf("%-14s ", vtype_name(v.type));
            put_scalar(f, k, &v, json);
            fputs(json ? "}" : "\n", stdout);
        }
    }
}

static int64_t n_params(const gguf_tensor *t) {
    int64_t p = 1;
    for (int d = 0; d < t->n_dims; d++) p *= t->ne[d];
    return p;
}

static void put_tensors(const gguf_file *f, int all, int json) {
    int64_t n = gguf_n_tensors(f), show = all || n <= DEFAULT_TENSORS ? n : DEFAULT_TENSORS;
    if (!json) {
        if (show < n) printf("tensors (first %" PRId64 " of %" PRId64 "; --tensors lists all):\n", show, n);
        else printf("tensors (%" PRId64 "):\n", n);
    }
    for (int64_t i = 0; i < show; i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        char shape[96];
        size_t m = 0;
        for (int d = 0; d < t->n_dims; d++)
            m += (size_t)snprintf(shape + m, sizeof shape - m, "%s%" PRId64, d ? ", " : "", t->ne[d]);
        if (json) {
            printf("%s\n    {\"name\": ", i ? "," : "");
            put_str(t->name, strlen(t->name), STR_MAX_JSON, 1);
            printf(", \"type\": \"%s\", \"shape\": [%s], \"params\": %" PRId64 ", \"bytes\": %" PRIu64
                   ", \"offset\": %" PRIu64 "}",
                   type_name(t->type), shape, n_params(t), t->size, t->offset);
        } else {
            printf("  %-40s %-8s [%s]%*s %14" PRIu64 "\n", t->name, type_name(t->type), shape,
                   (int)(m < 24 ? 24 - m : 0), "", t->size);
        }
    }
    if (!json && show < n) printf("  ... %" PRId64 " more\n", n - show);
}

typedef struct {
    char name[64];
    int64_t count, params;
    uint64_t bytes;
    uint64_t types; /* bit t set: some tensor of the class has type t */
} cls_sum;

static void put_classes(const gguf_file *f, int json) {
    int64_t n = gguf_n_tensors(f);
    cls_sum *cs = st_calloc((size_t)(n > 0 ? n : 1), sizeof *cs);
    int nc = 0;
    int64_t tot_params = 0;
    uint64_t tot_bytes = 0;
    for (int64_t i = 0; i < n; i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        char name[64];
        synth_tensor_class(t->name, name, sizeof name);
        int c = 0;
        while (c < nc && strcmp(cs[c].name, name)) c++;
        if (c == nc) snprintf(cs[nc++].name, sizeof cs[0].name, "%s", name);
        cs[c].count++;
        cs[c].params += n_params(t);
        cs[c].bytes += t->size;
        if (t->type >= 0 && t->type < 64) cs[c].types |= 1ull << t->type;
        tot_params += n_params(t);
        tot_bytes += t->size;
    }
    if (!json)
        printf("classes:\n  %-22s %6s  %-14s %14s %14s %7s\n", "class", "count", "types", "params", "bytes", "bpw");
    for (int c = 0; c < nc; c++) {
        char types[128];
        size_t m = 0;
        for (int t = 0; t < 64; t++)
            if (cs[c].types >> t & 1)
                m += (size_t)snprintf(types + m, sizeof types - m, json ? "%s\"%s\"" : "%s%s", m ? "," : "",
                                      type_name(t));
        double bpw = cs[c].params ? 8.0 * (double)cs[c].bytes / (double)cs[c].params : 0;
        if (json) {
            printf("%s\n    {\"class\": ", c ? "," : "");
            put_str(cs[c].name, strlen(cs[c].name), STR_MAX_JSON, 1);
            printf(", \"count\": %" PRId64 ", \"types\": [%s], \"params\": %" PRId64 ", \"bytes\": %" PRIu64
                   ", \"bpw\": %.4f}",
                   cs[c].count, types, cs[c].params, cs[c].bytes, bpw);
        } else {
            printf("  %-22s %6" PRId64 "  %-14s %14" PRId64 " %14" PRIu64 " %7.3f\n", cs[c].name, cs[c].count, types,
                   cs[c].params, cs[c].bytes, bpw);
        }
    }
    double bpw = tot_params ? 8.0 * (double)tot_bytes / (double)tot_params : 0;
    if (json)
        printf("\n  ],\n  \"totals\": {\"params\": %" PRId64 ", \"bytes\": %" PRIu64 ", \"bpw\": %.4f}", tot_params,
               tot_bytes, bpw);
    else
        printf("total: %" PRId64 " params (%.3f B), %" PRIu64 " bytes (%.3f GB), %.3f bits per weight\n", tot_params,
               tot_params / 1e9, tot_bytes, tot_bytes / 1e9, bpw);
    st_free(cs);
}

int cmd_info(int argc, char **argv) {
    args_t a = {.cmd = "info", .usage = USAGE, .argc = argc, .argv = argv, .i = 1};
    const char *path = NULL;
    int all = 0, json = 0;
    for (; a.i < argc; a.i++) {
        const char *s = argv[a.i];
        if (args_is_help(&a)) {
            printf("usage: %s\n\nPrints a GGUF file's header, metadata, tensors (first %d unless --tensors) and a\n"
                   "summary per tensor class (name without its block number): count, types, params,\n"
                   "bytes and bits per weight. --json prints the same as one JSON object.\n",
                   USAGE, DEFAULT_TENSORS);
            return 0;
        }
        if (!strcmp(s, "--tensors")) all = 1;
        else if (!strcmp(s, "--json")) json = 1;
        else if (s[0] == '-' && s[1]) return args_unknown(&a);
        else if (path) return args_unknown(&a);
        else path = s;
    }
    if (!path) return cli_usage_error("info", USAGE, "missing FILE");

    gguf_file *f = gguf_open(path);
    if (!f) {
        fprintf(stderr, "strata info: %s\n", st_error_get());
        return 1;
    }
    if (json) {
        printf("{\n  \"path\": ");
        put_str(path, strlen(path), 4096, 1);
        printf(",\n  \"version\": %u,\n  \"alignment\": %zu,\n  \"file_size\": %zu,\n  \"n_kv\": %" PRId64
               ",\n  \"n_tensors\": %" PRId64 ",\n  \"metadata\": [",
               gguf_version(f), gguf_alignment(f), gguf_file_size(f), gguf_n_kv(f), gguf_n_tensors(f));
        put_metadata(f, 1);
        printf("\n  ],\n  \"tensors\": [");
        put_tensors(f, all, 1);
        printf("\n  ],\n  \"classes\": [");
        put_classes(f, 1);
        printf("\n}\n");
    } else {
        printf("%s: GGUF v%u, alignment %zu, %zu bytes, %" PRId64 " metadata keys, %" PRId64 " tensors\n", path,
               gguf_version(f), gguf_alignment(f), gguf_file_size(f), gguf_n_kv(f), gguf_n_tensors(f));
        put_metadata(f, 0);
        put_tensors(f, all, 0);
        put_classes(f, 0);
    }
    gguf_close(f);
    return 0;
}
