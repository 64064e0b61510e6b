/* The one table of switches: every STRATA_* environment variable and every
 * engine/server flag, with its default (per architecture where it differs),
 * its effect, and at run time its value and who set it.
 *
 * DESIGN contract "a switch you set is never overridden": a value the user
 * gave (in the environment or as a flag) is never replaced by a config file
 * or a default. Precedence, highest first:
 *     flag  >  env  >  config  >  default
 * (a flag beats the environment because the command line is the narrower,
 * later choice; both beat a config file, which beats the built-in default).
 *
 * Environment switches keep living in the environment: st_switch_set()
 * exports the value it accepts (so an engine child process sees it too) and
 * records who set it in STRATA_SWITCH_SOURCES ("NAME=config;NAME=flag;"), so
 * the child's start log still names the right source. Call st_switch_set()
 * before any thread starts (setenv is not thread-safe); st_switch_get() may
 * be called from any thread afterwards.
 */
#ifndef STRATA_CORE_SWITCHES_H
#define STRATA_CORE_SWITCHES_H

typedef enum { ST_SW_DEFAULT = 0, ST_SW_CONFIG = 1, ST_SW_ENV = 2, ST_SW_FLAG = 3 } st_switch_src;

typedef enum {
    ST_SW_KIND_ENV,  /* a STRATA_* environment variable */
    ST_SW_KIND_FLAG, /* a command-line flag of serve/launch (name is its long spelling, "--ctx") */
} st_switch_kind;

typedef struct {
    const char *name; /* "STRATA_ISA", "--ctx" */
    st_switch_kind kind;
    const char *short_name; /* a flag's other spelling ("-c"), else NULL */
    const char *env_alias;  /* the variable that may also set a flag ("--api-key": STRATA_API_KEY), else NULL */
    long long lo, hi;       /* a flag taking a whole number: its range; lo == hi == 0: any string */
    const char *def;        /* the default as a value; NULL: unset (the code decides, see def_note) */
    const char *def_note;   /* the default in words, per architecture where it differs */
    const char *effect;     /* one line */
    int secret;             /* never print the value (API keys) */
} st_switch_def;

/* The table, and its length. */
const st_switch_def *st_switch_table(int *n);
/* The entry named name (also accepts a flag without its dashes: "ctx"), else NULL. */
const st_switch_def *st_switch_find(const char *name);

/* The value in effect: the flag's or the environment's or the config's,
 * else the default (may be NULL). An unknown name is a bug (ST_ASSERT). */
const char *st_switch_get(const char *name);
/* Who set the value st_switch_get returns. */
st_switch_src st_switch_source(const char *name);
const char *st_switch_src_name(st_switch_src src);

/* Set name to value on behalf of src (CONFIG or FLAG). Returns 1 if the value
 * is now in effect, 0 if a user's value of higher precedence keeps it
 * (a config value under an env/flag value), -1 with st_error for an unknown
 * name. value NULL unsets a flag or config value. */
int st_switch_set(const char *name, const char *value, st_switch_src src);

/* Log (INFO) one line per switch whose value differs from its default:
 * "switch NAME=VALUE (set by env|config|flag)", prefixed by who logs. */
void st_switch_log_start(const char *who);
/* The same lines into buf (each ends in '\n'); returns the number of
 * non-default switches. */
int st_switch_describe(char *buf, unsigned long cap);

#endif
