/* Internals of the synthetic model writer shared by synth.c, synth_vocab.c
 * and synth_zipf.c: a small deterministic RNG and the tokenizer builder.
 *
 * The RNG is xoshiro256** seeded through splitmix64, so that every tensor can
 * get its own stream from (seed, tensor index) and the file does not depend on
 * the order in which anything is generated.
 */
#ifndef STRATA_MODEL_SYNTH_INTERNAL_H
#define STRATA_MODEL_SYNTH_INTERNAL_H

#include <math.h>
#include <stdint.h>

#include "gguf/gguf.h"

typedef struct {
    uint64_t s[4];
    int has_spare; /* Box-Muller makes two normals at a time */
    float spare;
} syn_rng;

static inline uint64_t syn_splitmix(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* A stream for (seed, stream id): distinct ids give independent streams. */
static inline void syn_rng_init(syn_rng *r, uint64_t seed, uint64_t stream) {
    uint64_t x = seed ^ (stream * 0xD1B54A32D192ED03ull);
    for (int i = 0; i < 4; i++) r->s[i] = syn_splitmix(&x);
    r->has_spare = 0;
}

static inline uint64_t syn_rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static inline uint64_t syn_next(syn_rng *r) {
    uint64_t *s = r->s;
    uint64_t res = syn_rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = syn_rotl(s[3], 45);
    return res;
}

/* Uniform in (0, 1): never 0, so log() below is safe. */
static inline double syn_uniform(syn_rng *r) {
    return ((double)(syn_next(r) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

static inline float syn_normal(syn_rng *r) {
    if (r->has_spare) {
        r->has_spare = 0;
        return r->spare;
    }
    double u = syn_uniform(r), v = syn_uniform(r);
    double rad = sqrt(-2.0 * log(u)), th = 6.283185307179586 * v;
    r->spare = (float)(rad * sin(th));
    r->has_spare = 1;
    return (float)(rad * cos(th));
}

/* Writes the tokenizer.* metadata for a byte-level BPE ("gpt2" model, "qwen2"
 * pre-tokenizer) of exactly n_vocab tokens: 256 byte tokens, merge-derived
 * tokens, then <|endoftext|>, <|im_start|>, <|im_end|>. -1 if n_vocab is too
 * small to hold the bytes and the specials. */
int synth_vocab_write(gguf_writer *w, int n_vocab);

#endif
