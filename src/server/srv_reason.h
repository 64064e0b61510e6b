/* Reasoning in a model's text: the part of an answer a thinking model writes
 * before its answer, separated from it as llama-server does (OpenAI
 * `reasoning_content`, Anthropic `thinking` blocks).
 *
 * Two ways models mark it:
 * REASON_THINK    `<think>...</think>` at the start of the answer (Qwen3,
 *                 DeepSeek R1, QwQ); a template whose generation prompt
 *                 opens the block (`<think>\n` at the end of the prompt) makes
 *                 the answer start inside it
 * REASON_HARMONY  OpenAI's harmony format (gpt-oss): messages
 *                 `<|channel|>NAME<|message|>TEXT<|end|>` after the prompt's
 *                 `<|start|>assistant`, each new one opened by
 *                 `<|start|>assistant`; channel analysis is the reasoning,
 *                 final (and commentary without a recipient, a preamble) the
 *                 answer, and `to=functions.NAME` in a header a tool call whose
 *                 text is its JSON arguments, ended by `<|call|>`
 *
 * Harmony tool calls are handed on as the answer's text in the tagged form
 * the tool-call parser reads (`<tool_call>\n{"name": NAME, "arguments":
 * ARGS}\n</tool_call>`, srv_tools.h), so that calls stream and parse the same
 * way for every family.
 *
 * No HTTP types here: tests/server unit-tests it on text. */
#ifndef STRATA_SERVER_SRV_REASON_H
#define STRATA_SERVER_SRV_REASON_H

#include <stddef.h>

typedef enum { REASON_OFF, REASON_THINK, REASON_HARMONY } reason_kind;

/* How the model with this chat template marks reasoning (NULL: no template):
 * harmony when the template writes `<|channel|>`, else think tags. */
reason_kind reason_kind_of(const char *tmpl, size_t len);
/* The texts that open a reasoning block of this kind, that close it when the model ends it (`</think>`,
 * harmony's `<|end|>`), and that the engine writes when a reasoning budget ends it (`</think>`; harmony's
 * end of the analysis message and the opening of the final one). NULL for REASON_OFF. */
const char *reason_open_text(reason_kind kind);
const char *reason_close_text(reason_kind kind);
const char *reason_end_text(reason_kind kind);
/* 1 when a rendered prompt ends inside an open think block (`<think>` and
 * nothing but space after it): the answer starts in its reasoning. */
int reason_prompt_open(const char *prompt, size_t len);
/* Whether the answer starts in the reasoning when a prefill (the start of the answer, written by the
 * client) follows a prompt that left the block open or not: a prefill that opens <think> at its start
 * opens it, one with </think> closes it. 2: it continues inside the block (its space is the model's). */
int reason_prefill_open(int open, const char *prefill, size_t len);

typedef struct {
    void (*reasoning)(void *ctx, const char *text, size_t len);
    void (*content)(void *ctx, const char *text, size_t len);
} reason_cb;
typedef struct reason_stream reason_stream;

/* in_think: the answer starts inside the think block (reason_prompt_open; 2: in the middle of its text,
 * reason_prefill_open).
 * calls: harmony tool calls go on as tagged calls in the content (else a
 * call, which no tool asked for, is dropped, as llama-server drops it). */
reason_stream *reason_stream_new(reason_kind kind, int in_think, int calls, const reason_cb *cb, void *ctx);
/* Text as it is generated, in any pieces: the callbacks get the reasoning
 * (space around it trimmed) and the content as soon as they are told apart;
 * only what may still be a marker's beginning is held back. */
void reason_stream_feed(reason_stream *rs, const char *text, size_t len);
/* The text has ended: what was held back goes out. */
void reason_stream_end(reason_stream *rs);
void reason_stream_free(reason_stream *rs);

#endif
