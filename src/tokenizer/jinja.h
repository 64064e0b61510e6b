/* A small Jinja interpreter for chat templates.
 *
 * A GGUF carries its model's chat template (tokenizer.chat_template) as the
 * Jinja text Hugging Face renders with
 *   jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True,
 *       lstrip_blocks=True, extensions=[loopcontrols])
 * plus the globals raise_exception, strftime_now, namespace and a tojson
 * filter that does not escape HTML. This interpreter renders the subset of
 * Jinja those templates use with the same output, byte for byte: statements
 * if/elif/else, for (loop.*, else, filters, unpacking, break/continue), set
 * (namespaces, blocks), macro; expressions with literals, attribute/subscript/
 * slice access, Python's operators, tests, filters and str/dict methods.
 *
 * Templates and their inputs are untrusted: parse and render refuse, with an
 * error naming the place, anything past the limits below (nesting depth,
 * output size, memory, loop iterations) instead of running away.
 */
#ifndef STRATA_TOKENIZER_JINJA_H
#define STRATA_TOKENIZER_JINJA_H

#include <stddef.h>
#include <stdint.h>

struct json_t; /* jansson */

typedef struct jinja_tmpl jinja_tmpl;

typedef struct {
    size_t max_output;  /* bytes of rendered text */
    size_t max_memory;  /* bytes of values a render may build */
    uint64_t max_steps; /* loop iterations, all loops together (and range() sizes) */
    int max_depth;      /* macro calls / nested evaluation */
} jinja_limits;

/* Defaults: 16 MiB output, 256 MiB memory, 4M iterations, depth 64. */
void jinja_limits_default(jinja_limits *lim);

/* Parse a template. NULL on a syntax error, with st_error_get() naming line
 * and column; syntax nested deeper than 128 levels is refused the same way. */
jinja_tmpl *jinja_parse(const char *src, size_t len);
void jinja_free(jinja_tmpl *t);

/* Render with the keys of the JSON object ctx as variables (messages, tools,
 * add_generation_prompt, bos_token, eos_token, ...). Returns a malloc'd
 * NUL-terminated string (st_free), or NULL with st_error_get() set: a
 * runtime error names the line; raise_exception('msg') gives "msg". */
char *jinja_render_json(const jinja_tmpl *t, const struct json_t *ctx);
/* Same with explicit limits (NULL = defaults); *out_len gets the length. */
char *jinja_render_json_ex(const jinja_tmpl *t, const struct json_t *ctx, const jinja_limits *lim, size_t *out_len);

#endif
