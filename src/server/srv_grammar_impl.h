/* The compiled form of a grammar, shared by its compiler (srv_grammar.c) and
 * its matcher (srv_gmatch.c); nothing outside them sees it (srv_grammar.h).
 *
 * Every rule is a list of alternatives, every alternative a run of elements
 * ending in GE_END; an element is a byte set (GE_SET, an index into the
 * interned 256-bit sets) or a reference to a rule (GE_REF). */
#ifndef STRATA_SERVER_SRV_GRAMMAR_IMPL_H
#define STRATA_SERVER_SRV_GRAMMAR_IMPL_H

#include <stdint.h>

#include "server/srv_grammar.h"

enum { GE_END = 0, GE_SET, GE_REF };

typedef struct {
    uint32_t kind : 2;
    uint32_t arg : 30;
} gel;

struct grammar {
    gel *el;             /* (n_el) alternatives, each ending in GE_END */
    uint32_t *alt;       /* (n_alt) first element of each alternative */
    uint32_t *rule_alt;  /* (n_rules + 1) rule r's alternatives: alt[rule_alt[r] .. rule_alt[r+1]) */
    uint8_t (*sets)[32]; /* (n_sets) byte bitmaps */
    int n_el, n_alt, n_rules, n_sets, root;
};

#endif
