/* Read access to an opened GGUF file: header facts, metadata lookup by key
 * (hash table), typed getters, generic values and array elements, tensors.
 *
 * Everything here runs on a file that parse() already validated, so values
 * are decoded without further bounds checks; what is checked is the caller's
 * side: indices, element types, and whether an integer fits the asked type.
 */
#include "gguf/gguf_internal.h"

#include <string.h>

#include "core/log.h"

uint32_t gguf_version(const gguf_file *f) { return f->version; }
size_t gguf_alignment(const gguf_file *f) { return f->alignment; }
const char *gguf_path(const gguf_file *f) { return f->path; }
size_t gguf_file_size(const gguf_file *f) { return f->size; }
uint64_t gguf_data_offset(const gguf_file *f) { return f->data_off; }

int64_t gguf_n_kv(const gguf_file *f) { return f->n_kv; }

int64_t gguf_find_key(const gguf_file *f, const char *key) {
    size_t len = strlen(key);
    for (uint64_t h = gguf_hash(key, len) & f->kv_mask;; h = (h + 1) & f->kv_mask) {
        int64_t i = f->kv_hash[h];
        if (i < 0) return -1;
        if (f->kv[i].key_len == len && !memcmp(f->kv[i].key, key, len)) return i;
    }
}

const char *gguf_key(const gguf_file *f, int64_t i) { return i >= 0 && i < f->n_kv ? f->kv[i].key : NULL; }

gguf_vtype gguf_kv_type(const gguf_file *f, int64_t i) { return i >= 0 && i < f->n_kv ? f->kv[i].type : GGUF_T_COUNT; }

/* Integer value of a scalar; -1 if not an integer type or outside int64.
 * bool counts as an integer only where allow_bool says so. */
static int scalar_i64(gguf_vtype t, const uint8_t *p, int allow_bool, int64_t *out) {
    switch (t) {
    case GGUF_T_UINT8: *out = p[0]; return 0;
    case GGUF_T_INT8: *out = (int8_t)p[0]; return 0;
    case GGUF_T_BOOL:
        if (!allow_bool) return -1;
        *out = p[0];
        return 0;
    case GGUF_T_UINT16: {
        uint16_t v;
        memcpy(&v, p, 2);
        *out = v;
        return 0;
    }
    case GGUF_T_INT16: {
        int16_t v;
        memcpy(&v, p, 2);
        *out = v;
        return 0;
    }
    case GGUF_T_UINT32: *out = gguf_rd_u32(p); return 0;
    case GGUF_T_INT32: {
        int32_t v;
        memcpy(&v, p, 4);
        *out = v;
        return 0;
    }
    case GGUF_T_UINT64: {
        uint64_t v = gguf_rd_u64(p);
        if (v > INT64_MAX) return -1;
        *out = (int64_t)v;
        return 0;
    }
    case GGUF_T_INT64: {
        int64_t v;
        memcpy(&v, p, 8);
        *out = v;
        return 0;
    }
    default: return -1;
    }
}

static int scalar_f64(gguf_vtype t, const uint8_t *p, double *out) {
    if (t == GGUF_T_FLOAT32) {
        float v;
        memcpy(&v, p, 4);
        *out = v;
        return 0;
    }
    if (t == GGUF_T_FLOAT64) {
        memcpy(out, p, 8);
        return 0;
    }
    int64_t i;
    if (t == GGUF_T_UINT64) {
        *out = (double)gguf_rd_u64(p);
        return 0;
    }
    if (scalar_i64(t, p, 1, &i) == 0) {
        *out = (double)i;
        return 0;
    }
    return -1;
}

static const gguf_kv *find(const gguf_file *f, const char *key) {
    int64_t i = gguf_find_key(f, key);
    return i < 0 ? NULL : &f->kv[i];
}

int gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out) {
    const gguf_kv *kv = find(f, key);
    int64_t v;
    if (!kv || scalar_i64(kv->type, kv->raw, 0, &v) < 0 || v < 0 || v > UINT32_MAX) return -1;
    *out = (uint32_t)v;
    return 0;
}

int gguf_get_i64(const gguf_file *f, const char *key, int64_t *out) {
    const gguf_kv *kv = find(f, key);
    if (!kv || scalar_i64(kv->type, kv->raw, 0, out) < 0) return -1;
    return 0;
}

int gguf_get_f32(const gguf_file *f, const char *key, float *out) {
    const gguf_kv *kv = find(f, key);
    double v;
    if (!kv || (kv->type != GGUF_T_FLOAT32 && kv->type != GGUF_T_FLOAT64)) return -1;
    scalar_f64(kv->type, kv->raw, &v);
    *out = (float)v;
    return 0;
}

int gguf_get_bool(const gguf_file *f, const char *key, int *out) {
    const gguf_kv *kv = find(f, key);
    if (!kv || kv->type != GGUF_T_BOOL) return -1;
    *out = kv->raw[0];
    return 0;
}

int gguf_get_str(const gguf_file *f, const char *key, const char **s, uint64_t *len) {
    const gguf_kv *kv = find(f, key);
    if (!kv || kv->type != GGUF_T_STRING) return -1;
    *len = gguf_rd_u64(kv->raw);
    *s = (const char *)kv->raw + 8;
    return 0;
}

int gguf_get_value(const gguf_file *f, int64_t i, gguf_value *out) {
    if (i < 0 || i >= f->n_kv) return -1;
    const gguf_kv *kv = &f->kv[i];
    out->type = kv->type;
    out->elem_type = kv->elem_type;
    out->n = kv->n;
    out->raw = kv->raw;
    out->elem_off = kv->idx == UINT64_MAX ? NULL : f->pool.v + kv->idx;
    return 0;
}

/* Bytes of element j of array v; NULL if v is no array or j is out of range.
 * A scalar or string value acts as an array of one (j = 0). */
static const uint8_t *elem(const gguf_value *v, uint64_t j, gguf_vtype *et) {
    if (v->type != GGUF_T_ARRAY) {
        if (j != 0) return NULL;
        *et = v->type;
        return v->raw;
    }
    if (j >= v->n) return NULL;
    *et = v->elem_type;
    size_t esz = gguf_scalar_size(v->elem_type);
    if (esz) return v->raw + j * esz;
    if (v->elem_off) return v->raw + v->elem_off[j];
    /* no index (a nested array whose parent had none): walk */
    const uint8_t *p = v->raw;
    for (uint64_t k = 0; k < j; k++) p += gguf_value_size(v->elem_type, p, 1);
    return p;
}

int gguf_arr_get_i64(const gguf_value *v, uint64_t j, int64_t *out) {
    gguf_vtype et;
    const uint8_t *p = elem(v, j, &et);
    return p ? scalar_i64(et, p, 1, out) : -1;
}

int gguf_arr_get_f64(const gguf_value *v, uint64_t j, double *out) {
    gguf_vtype et;
    const uint8_t *p = elem(v, j, &et);
    return p ? scalar_f64(et, p, out) : -1;
}

int gguf_arr_get_str(const gguf_value *v, uint64_t j, const char **s, uint64_t *len) {
    gguf_vtype et;
    const uint8_t *p = elem(v, j, &et);
    if (!p || et != GGUF_T_STRING) return -1;
    *len = gguf_rd_u64(p);
    *s = (const char *)p + 8;
    return 0;
}

int gguf_arr_get_value(const gguf_value *v, uint64_t j, gguf_value *out) {
    if (v->type != GGUF_T_ARRAY) return -1;
    gguf_vtype et;
    const uint8_t *p = elem(v, j, &et);
    if (!p) return -1;
    out->type = et;
    out->elem_off = NULL;
    if (et != GGUF_T_ARRAY) {
        out->elem_type = et;
        out->n = 1;
        out->raw = p;
        return 0;
    }
    out->elem_type = (gguf_vtype)gguf_rd_u32(p);
    out->n = gguf_rd_u64(p + 4);
    out->raw = p + 12;
    /* the parent's block holds, after its n offsets, the distance to each child's block */
    if (v->elem_off && v->elem_off[v->n + j]) out->elem_off = v->elem_off + v->elem_off[v->n + j];
    return 0;
}

int64_t gguf_n_tensors(const gguf_file *f) { return f->n_tensors; }

const gguf_tensor *gguf_tensor_at(const gguf_file *f, int64_t i) {
    return i >= 0 && i < f->n_tensors ? &f->ti[i].t : NULL;
}

const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name) {
    size_t len = strlen(name);
    for (uint64_t h = gguf_hash(name, len) & f->t_mask;; h = (h + 1) & f->t_mask) {
        int64_t i = f->t_hash[h];
        if (i < 0) return NULL;
        if (f->ti[i].name_len == len && !memcmp(f->ti[i].t.name, name, len)) return &f->ti[i].t;
    }
}
