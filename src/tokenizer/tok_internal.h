/* Tokenizer internals shared by the files of src/tokenizer/: the tokenizer
 * struct, the two hash maps it is built on, and the per-call scratch space.
 *
 * Maps are open-addressing tables with linear probing; they are built once at
 * load and only read afterwards, so lookups need no locks.
 */
#ifndef STRATA_TOKENIZER_INTERNAL_H
#define STRATA_TOKENIZER_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "tokenizer.h"

/* ---- string -> id map (keys are borrowed: they live in a tokenizer blob) ---- */
typedef struct {
    const char *key;
    uint32_t len;
    int32_t val; /* -1 marks an empty slot */
} tok_strmap_slot;

typedef struct {
    tok_strmap_slot *slots;
    uint64_t mask; /* capacity - 1, capacity a power of two */
} tok_strmap;

void tok_strmap_init(tok_strmap *m, uint64_t n_keys);
void tok_strmap_free(tok_strmap *m);
/* Insert unless present; the first insertion wins (as a vocabulary's first id does). */
void tok_strmap_put(tok_strmap *m, const char *key, uint32_t len, int32_t val);
int32_t tok_strmap_get(const tok_strmap *m, const char *key, size_t len); /* -1 if absent */

/* ---- (left id, right id) -> (rank, merged id) map for BPE merges ---- */
typedef struct {
    uint64_t key; /* left << 32 | right; UINT64_MAX marks an empty slot */
    int32_t rank;
    int32_t merged;
} tok_pairmap_slot;

typedef struct {
    tok_pairmap_slot *slots;
    uint64_t mask;
} tok_pairmap;

void tok_pairmap_init(tok_pairmap *m, uint64_t n_keys);
void tok_pairmap_free(tok_pairmap *m);
void tok_pairmap_put(tok_pairmap *m, int32_t left, int32_t right, int32_t rank, int32_t merged);
/* 0 and fills rank/merged, or -1 if the pair is not a merge. */
int tok_pairmap_get(const tok_pairmap *m, int32_t left, int32_t right, int32_t *rank, int32_t *merged);

/* ---- the tokenizer ---- */
#define TOK_MAX_REGEX 4
#define TOK_MAX_EOG   16

struct tokenizer {
    tok_model model;
    char pre[64];
    int32_t n_vocab;

    /* vocabulary text as stored in the file */
    char *text_blob;
    uint64_t *text_off; /* (n_vocab + 1) */
    /* the bytes each token stands for in output text (byte-level decoded for
     * BPE, U+2581 -> ' ' and <0xXX> -> byte for SentencePiece) */
    char *piece_blob;
    uint64_t *piece_off; /* (n_vocab + 1) */
    float *scores;       /* (n_vocab) SentencePiece scores; 0 when absent */
    uint8_t *types;      /* (n_vocab) tok_type */

    tok_strmap text_map;   /* stored text -> id, every token */
    tok_strmap piece_map;  /* BPE: decoded bytes -> id, normal tokens */
    tok_pairmap merges;    /* BPE: pair -> rank, merged id */
    int32_t byte_tok[256]; /* BPE: single-byte token; SPM: <0xXX>; -1 if none */

    /* control / user-defined / unknown tokens matched in raw text, grouped by
     * first byte and longest first inside a group */
    int32_t *special_ids;
    uint32_t special_start[257];

    int32_t bos, eos, eot, eom, unk, pad;
    int add_bos, add_eos, add_space_prefix, ignore_merges;
    int32_t eog[TOK_MAX_EOG];
    int n_eog;

    /* pre-tokenizer: regexes applied in turn, each splitting the pieces the
     * previous left (matches and the gaps between them both become pieces) */
    void *re[TOK_MAX_REGEX]; /* pcre2_code_8 * */
    int n_re;
};

static inline const char *tok_text(const tokenizer *t, int32_t id, size_t *len) {
    *len = (size_t)(t->text_off[id + 1] - t->text_off[id]);
    return t->text_blob + t->text_off[id];
}

static inline const char *tok_piece(const tokenizer *t, int32_t id, size_t *len) {
    *len = (size_t)(t->piece_off[id + 1] - t->piece_off[id]);
    return t->piece_blob + t->piece_off[id];
}

/* A growable array of ids (the encoder's output before it is copied out). */
typedef struct {
    int32_t *v;
    int64_t n, cap;
} tok_ids;

void tok_ids_push(tok_ids *a, int32_t id);

/* Per-file entry points. */
int tok_bpe_init(tokenizer *t); /* byte map, piece map, merges, regexes; -1 + st_error */
void tok_bpe_free(tokenizer *t);
/* Encode a fragment of raw text (no special tokens in it). -1 + st_error on a regex failure. */
int tok_bpe_encode(const tokenizer *t, const char *s, size_t n, tok_ids *out);
int tok_spm_init(tokenizer *t);
int tok_spm_encode(const tokenizer *t, const char *s, size_t n, int space_prefix, tok_ids *out);

/* Length of the UTF-8 character at p (1..4) when it is complete and valid;
 * 0 when it is invalid; -(needed) when it is a valid but cut-short prefix. */
int tok_utf8_char(const uint8_t *p, size_t avail);

#endif
