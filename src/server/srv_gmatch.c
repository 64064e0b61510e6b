/* Grammar matcher (srv_grammar.h): a grammar followed byte by byte, and a
 * walk of the whole vocabulary.
 *
 * The state is the set of parse stacks whose top is a byte set. A stack is
 * a (position, parent) pair: position an element index, parent a node
 * (position after a reference, its own parent) of a tree that shares stack
 * tails. Nodes are hash-consed (one node per (position, parent), also
 * across steps) and within one step a stack is recorded once (a table with
 * generation stamps), so ambiguous grammars do not multiply stacks; a
 * reference that ends its alternative returns straight to its parent (a
 * tail call), so repetitions do not deepen them. Trials append to arenas
 * that are rolled back afterwards, so testing a token copies nothing. */
#include <string.h>

#include "core/alloc.h"
#include "server/srv_grammar.h"
#include "server/srv_grammar_impl.h"

static int set_has(const uint8_t *s, uint8_t b) { return (s[b >> 3] >> (b & 7)) & 1; }

typedef struct {
    uint32_t pos;
    int32_t parent;
} gnode;

#define MEMO_SIZE (GRAMMAR_MAX_EXPAND * 4)

typedef struct {
    uint32_t gen, pos;
    int32_t parent;
    int32_t node; /* the return node made for the pair, or -1 */
    uint8_t top;  /* the pair is among this step's stacks */
} memo_ent;

struct gmatch {
    const grammar *g;
    gnode *nodes; /* return nodes: parents of stacks */
    uint32_t n_nodes, cap_nodes;
    gnode *tops; /* stack tops of all states kept (position of a byte set, parent) */
    uint32_t n_tops, cap_tops;
    uint32_t cur_b, cur_e; /* the current state: tops[cur_b..cur_e) */
    int cur_acc;
    memo_ent *memo;
    uint32_t gen;
    struct hc_ent {
        uint32_t pos;
        int32_t parent, id; /* id -1: empty */
    } * hc;                 /* return nodes by content, so that equal stacks are one (hash-consing) */
    uint32_t hc_cap, hc_used;
    int work, over, acc; /* the step being built */
    uint64_t pass_work;  /* expansion steps of the current vocabulary walk */
};

static memo_ent *memo_get(gmatch *m, uint32_t pos, int32_t parent) {
    uint32_t h = (pos * 2654435761u) ^ ((uint32_t)parent * 40503u);
    h &= MEMO_SIZE - 1;
    for (;;) {
        memo_ent *e = &m->memo[h];
        if (e->gen != m->gen) {
            *e = (memo_ent){.gen = m->gen, .pos = pos, .parent = parent, .node = -1};
            return e;
        }
        if (e->pos == pos && e->parent == parent) return e;
        h = (h + 1) & (MEMO_SIZE - 1);
    }
}

static uint32_t hc_hash(uint32_t pos, int32_t parent) {
    return (pos * 2654435761u) ^ ((uint32_t)parent * 2246822519u) ^ ((uint32_t)parent >> 15);
}

/* An entry is live while its node is: the arena may have been rolled back past it since. */
static int hc_live(const gmatch *m, const struct hc_ent *e) {
    return e->id >= 0 && (uint32_t)e->id < m->n_nodes && m->nodes[e->id].pos == e->pos &&
           m->nodes[e->id].parent == e->parent;
}

static void hc_grow(gmatch *m) {
    struct hc_ent *old = m->hc;
    uint32_t n = m->hc_cap;
    m->hc_cap = n ? n * 2 : 1024;
    m->hc = st_malloc((size_t)m->hc_cap * sizeof *m->hc);
    for (uint32_t i = 0; i < m->hc_cap; i++) m->hc[i].id = -1;
    m->hc_used = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (!hc_live(m, &old[i])) continue;
        uint32_t h = hc_hash(old[i].pos, old[i].parent) & (m->hc_cap - 1);
        while (m->hc[h].id >= 0) h = (h + 1) & (m->hc_cap - 1);
        m->hc[h] = old[i];
        m->hc_used++;
    }
    st_free(old);
}

/* The node (pos, parent): the existing one, or a new one. */
static int32_t get_node(gmatch *m, uint32_t pos, int32_t parent) {
    if ((m->hc_used + 1) * 2 > m->hc_cap) hc_grow(m);
    uint32_t mask = m->hc_cap - 1, h = hc_hash(pos, parent) & mask;
    int64_t reuse = -1; /* the first dead entry on the way: taken by a new node */
    for (; m->hc[h].id >= 0; h = (h + 1) & mask) {
        struct hc_ent *e = &m->hc[h];
        if (!hc_live(m, e)) {
            if (reuse < 0) reuse = h;
        } else if (e->pos == pos && e->parent == parent) return e->id;
    }
    if (reuse >= 0) h = (uint32_t)reuse;
    else m->hc_used++;
    if (m->n_nodes == m->cap_nodes) {
        m->cap_nodes = m->cap_nodes ? m->cap_nodes * 2 : 1024;
        m->nodes = st_realloc(m->nodes, (size_t)m->cap_nodes * sizeof(gnode));
    }
    int32_t id = (int32_t)m->n_nodes++;
    m->nodes[id] = (gnode){pos, parent};
    m->hc[h] = (struct hc_ent){pos, parent, id};
    return id;
}

/* Continue a stack at element pos under parent: pop finished rules, expand
 * references, and record the byte sets reached as this step's tops. */
static void expand(gmatch *m, uint32_t pos, int32_t parent) {
    const grammar *g = m->g;
    for (;;) {
        if (++m->work > GRAMMAR_MAX_EXPAND) {
            m->over = 1;
            return;
        }
        gel e = g->el[pos];
        if (e.kind == GE_END) {
            if (parent < 0) {
                m->acc = 1;
                return;
            }
            pos = m->nodes[parent].pos;
            parent = m->nodes[parent].parent;
            continue;
        }
        memo_ent *me = memo_get(m, pos, parent);
        if (e.kind == GE_SET) {
            if (me->top) return;
            me->top = 1;
            if (m->n_tops - 0 >= m->cap_tops) {
                m->cap_tops = m->cap_tops ? m->cap_tops * 2 : 256;
                m->tops = st_realloc(m->tops, (size_t)m->cap_tops * sizeof(gnode));
            }
            m->tops[m->n_tops++] = (gnode){pos, parent};
            return;
        }
        /* GE_REF: a return node (pos + 1, parent), made once per step; a reference that ends its
         * alternative returns straight to parent (a tail call), so x* and other right recursion
         * keep stacks flat and equal stacks meet in the memo instead of multiplying */
        if (me->node >= 0 || me->top) return; /* this pair was expanded already in this step */
        int32_t ret = g->el[pos + 1].kind == GE_END ? parent : get_node(m, pos + 1, parent);
        me->node = ret;
        me->top = 1; /* (reused as "expanded" for a reference: parent may be -1, which node cannot tell) */
        uint32_t a0 = g->rule_alt[e.arg], a1 = g->rule_alt[e.arg + 1];
        for (uint32_t a = a0; a < a1 && !m->over; a++) expand(m, g->alt[a], ret);
        return;
    }
}

static void step_begin(gmatch *m) {
    if (++m->gen == 0) { /* wrapped: clear the stamps */
        memset(m->memo, 0, MEMO_SIZE * sizeof(memo_ent));
        m->gen = 1;
    }
    m->work = 0;
    m->over = 0;
    m->acc = 0;
}

/* The state after byte c from tops[b..e): new tops appended; returns their
 * first index, or -1 when c is refused (no stack takes it, or the limits). */
static int64_t advance(gmatch *m, uint32_t b, uint32_t e, uint8_t c, int *acc) {
    step_begin(m);
    uint32_t nb = m->n_tops;
    for (uint32_t i = b; i < e && !m->over; i++) {
        gnode t = m->tops[i];
        if (set_has(m->g->sets[m->g->el[t.pos].arg], c)) expand(m, t.pos + 1, t.parent);
    }
    if (m->over || m->n_tops - nb > GRAMMAR_MAX_STACKS || (m->n_tops == nb && !m->acc)) {
        m->n_tops = nb;
        return -1;
    }
    *acc = m->acc;
    return nb;
}

gmatch *gmatch_new(const grammar *g) {
    gmatch *m = st_calloc(1, sizeof *m);
    m->g = g;
    m->memo = st_calloc(MEMO_SIZE, sizeof(memo_ent));
    step_begin(m);
    for (uint32_t a = g->rule_alt[g->root]; a < g->rule_alt[g->root + 1] && !m->over; a++) expand(m, g->alt[a], -1);
    m->cur_b = 0;
    m->cur_e = m->over ? 0 : m->n_tops;
    m->cur_acc = m->acc;
    return m;
}

void gmatch_free(gmatch *m) {
    if (!m) return;
    st_free(m->nodes);
    st_free(m->tops);
    st_free(m->memo);
    st_free(m->hc);
    st_free(m);
}

static int run(gmatch *m, const char *s, size_t n, int keep) {
    uint32_t mark_n = m->n_nodes, mark_t = m->n_tops, b = m->cur_b, e = m->cur_e;
    int acc = m->cur_acc;
    for (size_t i = 0; i < n; i++) {
        int64_t nb = advance(m, b, e, (uint8_t)s[i], &acc);
        if (nb < 0) {
            m->n_nodes = mark_n;
            m->n_tops = mark_t;
            return 0;
        }
        b = (uint32_t)nb;
        e = m->n_tops;
    }
    if (keep) {
        m->cur_b = b;
        m->cur_e = e;
        m->cur_acc = acc;
    } else {
        m->n_nodes = mark_n;
        m->n_tops = mark_t;
    }
    return 1;
}

int gmatch_feed(gmatch *m, const char *s, size_t n) { return run(m, s, n, 1) ? 0 : -1; }
int gmatch_try(gmatch *m, const char *s, size_t n) { return run(m, s, n, 0); }
int gmatch_accepting(const gmatch *m) { return m->cur_acc; }
int gmatch_finished(const gmatch *m) { return m->cur_acc && m->cur_b == m->cur_e; }

int gmatch_allowed(gmatch *m, const gmatch_vocab *v, uint8_t *allowed, int n_vocab) {
    memset(allowed, 0, (size_t)n_vocab);
    enum { MAXD = 257 };
    struct {
        uint32_t b, e, mark_n, mark_t;
    } st[MAXD];
    st[0].b = m->cur_b;
    st[0].e = m->cur_e;
    st[0].mark_n = m->n_nodes;
    st[0].mark_t = m->n_tops;
    const uint32_t mark_n = m->n_nodes, mark_t = m->n_tops;
    m->pass_work = 0;
    int depth = 0, count = 0; /* st[0..depth] are the states after that many bytes of the previous piece */
    for (int i = 0; i < v->n; i++) {
        int32_t t = v->ids[i];
        const char *p = v->text + v->off[t];
        int len = (int)(v->off[t + 1] - v->off[t]);
        if (len >= MAXD) continue;
        int k = (int)v->lcp[i] < depth ? (int)v->lcp[i] : depth;
        m->n_nodes = st[k].mark_n; /* drop what was built past the shared prefix */
        m->n_tops = st[k].mark_t;
        depth = k;
        int ok = 1;
        while (depth < len) {
            int acc;
            int64_t nb = advance(m, st[depth].b, st[depth].e, (uint8_t)p[depth], &acc);
            m->pass_work += (uint64_t)m->work + (st[depth].e - st[depth].b);
            if (m->pass_work > GRAMMAR_MAX_PASS_WORK) { /* too costly to follow: the caller ends the answer */
                m->n_nodes = mark_n;
                m->n_tops = mark_t;
                return -1;
            }
            if (nb < 0) {
                ok = 0;
                break;
            }
            depth++;
            st[depth].b = (uint32_t)nb;
            st[depth].e = m->n_tops;
            st[depth].mark_n = m->n_nodes;
            st[depth].mark_t = m->n_tops;
        }
        if (ok) {
            allowed[t] = 1;
            count++;
            continue;
        }
        /* byte p[depth] is refused: so is every following piece that begins with p[0..depth] */
        while (i + 1 < v->n && (int)v->lcp[i + 1] > depth) i++;
    }
    m->n_nodes = mark_n;
    m->n_tops = mark_t;
    return count;
}
