#!/usr/bin/env python3
"""Write tests/data/jinja/cases.json: chat templates rendered by Python's jinja2
exactly as Hugging Face's apply_chat_template renders them, for the C
interpreter (src/tokenizer/jinja*.c) to reproduce byte for byte.

The environment is HF's (transformers/utils/chat_template_utils.py,
_compile_jinja_template): ImmutableSandboxedEnvironment(trim_blocks=True,
lstrip_blocks=True, extensions=[loopcontrols]), a tojson filter that is
json.dumps(ensure_ascii=False), and the globals raise_exception, strftime_now,
namespace. HF calls render(messages=..., tools=..., documents=...,
add_generation_prompt=..., **special_tokens) -- tools and documents are None
when not given -- and this script passes the same keys. When transformers is
importable, every case is also rendered through its own render_jinja_template
and must agree.

Templates (tests/data/jinja/templates/*.jinja) are public data: smollm2 is
read from models/SmolLM2-135M-Instruct.Q4_1.gguf (the Gemma 3 270M GGUF has
none); the others are the published templates of Qwen2.5, Qwen3, Llama 3.2,
Llama 3.3, Gemma 3, DeepSeek-V3 (R1-era revision), DeepSeek-V3.1 and GLM-4.6, as
collected in llama.cpp's models/templates and the models' tokenizer_config.json.

Each case: {"name", "template" (file stem) or "source" (inline text),
"context", and "expect" (the output) or "error" (raise_exception's message,
or true for any other Jinja error)}.

Usage: python3 tools/make_jinja_fixtures.py   (from the repository root)
"""
import json
import os
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "jinja")


def hf_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["namespace"] = jinja2.utils.Namespace
    return env


ENV = hf_env()


def render(source, ctx):
    try:
        return {"expect": ENV.from_string(source).render(**ctx)}
    except jinja2.exceptions.TemplateSyntaxError:
        raise
    except jinja2.exceptions.TemplateError as e:
        # raise_exception gives a plain TemplateError; Undefined/TypeError etc. are "some error"
        if type(e) is jinja2.exceptions.TemplateError:
            return {"error": str(e)}
        return {"error": True}
    except (TypeError, ValueError, AttributeError, KeyError, IndexError, ZeroDivisionError):
        return {"error": True}


def hf_check(source, ctx, got):
    """Cross-check against transformers' own renderer where it is installed."""
    try:
        from transformers.utils.chat_template_utils import render_jinja_template
    except Exception:
        return False
    kw = {k: v for k, v in ctx.items() if k not in ("messages", "tools", "documents", "add_generation_prompt")}
    try:
        out, _ = render_jinja_template(conversations=[ctx["messages"]], tools=ctx.get("tools"),
                                       documents=ctx.get("documents"), chat_template=source,
                                       add_generation_prompt=ctx.get("add_generation_prompt", False), **kw)
        ref = {"expect": out[0]}
    except jinja2.exceptions.TemplateError as e:
        ref = {"error": str(e) if type(e) is jinja2.exceptions.TemplateError else True}
    except Exception:
        ref = {"error": True}
    if ref != got:
        sys.exit(f"transformers disagrees with the plain jinja2 environment:\n{ref}\n{got}")
    return True


# ---- conversations -------------------------------------------------------
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a city (°C).",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name, e.g. \"Zürich\""},
            "days": {"type": "integer", "minimum": 1, "maximum": 7},
            "threshold": {"type": "number", "default": 0.5},
            "units": {"type": "string", "enum": ["metric", "imperial"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search the web.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}},
            "required": ["query"]}}},
]

SYS = {"role": "system", "content": "You are a helpful assistant."}
U1 = {"role": "user", "content": "Hello! What can you do?"}
A1 = {"role": "assistant", "content": "I can answer questions and call tools."}
U2 = {"role": "user", "content": "What's the weather in Zürich for 3 days?"}
CALL_DICT = {"role": "assistant", "content": "", "tool_calls": [
    {"id": "call_1", "type": "function",
     "function": {"name": "get_weather", "arguments": {"city": "Zürich", "days": 3}}}]}
CALL_STR = {"role": "assistant", "content": "", "tool_calls": [
    {"id": "call_1", "type": "function",
     "function": {"name": "get_weather", "arguments": "{\"city\": \"Zürich\", \"days\": 3}"}}]}
CALL_TWO = {"role": "assistant", "content": "Let me check both.", "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}},
    {"id": "call_2", "type": "function", "function": {"name": "search", "arguments": "{\"query\": \"Oslo news\"}"}}]}
TOOL_RES = {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp_c\": 21.5, \"sky\": \"clear\"}"}
TOOL_RES2 = {"role": "tool", "tool_call_id": "call_2", "content": "Top story: fjords."}
A_FINAL = {"role": "assistant", "content": "It is 21.5 °C and clear in Zürich."}
THINK = {"role": "assistant", "content": "<think>\nThe user greets me.\n</think>\n\nHi there! How can I help?"}
REASON = {"role": "assistant", "content": "Paris.", "reasoning_content": "Capital of France is Paris."}
TRICKY = {"role": "user", "content": "  Quotes \"double\" and 'single', a backslash \\ , tab\t, "
                                     "日本語, emoji 🎉, <|im_end|> literal and trailing spaces   \n"}
BLOCKS_U = {"role": "user", "content": [{"type": "text", "text": "Describe "}, {"type": "text", "text": " this."}]}
BLOCKS_S = {"role": "system", "content": [{"type": "text", "text": "Be brief."}]}

CONVS = {
    "sys_user": ([SYS, U1], {}),
    "user_only": ([U1], {}),
    "multi_turn": ([SYS, U1, A1, U2], {}),
    "ends_with_assistant": ([SYS, U1, A1], {}),
    "tools_offered": ([SYS, U2], {"tools": TOOLS}),
    "tools_no_system": ([U2], {"tools": TOOLS}),
    "tool_call_dict_args": ([SYS, U2, CALL_DICT, TOOL_RES], {"tools": TOOLS}),
    "tool_call_str_args": ([SYS, U2, CALL_STR, TOOL_RES, A_FINAL, {"role": "user", "content": "Thanks!"}],
                           {"tools": TOOLS}),
    "two_tool_calls": ([U2, CALL_TWO, TOOL_RES, TOOL_RES2], {"tools": TOOLS}),
    "thinking_history": ([U1, THINK, U2], {}),
    "reasoning_field": ([U1, REASON], {}),
    "no_thinking": ([U1], {"enable_thinking": False}),
    "tricky_text": ([SYS, TRICKY], {}),
    "content_blocks": ([BLOCKS_S, BLOCKS_U], {}),
    "two_systems": ([SYS, {"role": "system", "content": "Answer in French."}, U1], {}),
    "alternation_broken": ([U1, U2], {}),
}

FAMILIES = {
    # template stem: (bos, eos, extra context)
    "smollm2": ("<|im_start|>", "<|im_end|>", {}),
    "qwen25": ("", "<|im_end|>", {}),
    "qwen3": ("", "<|im_end|>", {}),
    "llama32": ("<|begin_of_text|>", "<|eot_id|>", {"date_string": "26 Jul 2024"}),
    "llama33": ("<|begin_of_text|>", "<|eot_id|>", {}),
    "gemma3": ("<bos>", "<eos>", {}),
    "deepseek_v3": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", {}),
    "deepseek_v31": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", {"thinking": False}),
    "glm46": ("", "<|endoftext|>", {}),
}

# ---- single features, each against jinja2 --------------------------------
FEATURES = [
    ("ws_trim_lstrip", "a\n  {% if true %}\n  x\n  {% endif %}\n  {{ 'y' }}\nz\n", {}),
    ("ws_dash", "a  {%- if true -%}  b  {%- endif -%}  c {{- ' d ' -}} e", {}),
    ("ws_plus", "a\n\t {%+ if 1 %}x{% endif +%}\nb", {}),
    ("ws_comment", "a\n  {# note #}\nb{#- x -#}  c", {}),
    ("ws_inline_tag", "a  {% if 1 %}x{% endif %}\nb", {}),
    ("literals", "{{ [1, 'a', none, true, 1.5, {'k': 'v'}, (1, 2), (3,)] }}|{{ 1.0 }}|{{ 1e20 }}|{{ 0.1 + 0.2 }}|{{ 2.5e-5 }}", {}),
    ("string_escapes", "{{ 'a\\tb\\x41\\u00e9\\q\\n' ~ \"it's\" }}|{{ 'x' 'y' }}", {}),
    ("arith", "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 / 2 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 4 / 2 }} {{ 'ab' * 3 }} {{ [1] * 2 }} {{ 1 + 2 * 3 - 4 }} {{ true + 1 }}", {}),
    ("logic", "{{ 1 and 'a' }}|{{ 0 or 'b' }}|{{ none or [] }}|{{ not 1 }}|{{ 1 < 2 < 3 }}|{{ 'b' > 'a' }}|{{ 2 in [1, 2] }}|{{ 'x' not in 'abc' }}|{{ 'k' in {'k': 1} }}", {}),
    ("cond_expr", "{{ 'yes' if x else 'no' }}|{{ 'a' if false }}|{{ (1 if true else 2) + 1 }}", {"x": 0}),
    ("concat_tilde", "{{ 'a' ~ 1 ~ none ~ true ~ 1.5 }}", {}),
    ("attr_item", "{{ d.a }}|{{ d['b'] }}|{{ d.c is defined }}|{{ l[0] }}{{ l[-1] }}|{{ l.1 }}|{{ d['items'] }}|{{ d.get('a') }}{{ d.get('zz', 'dflt') }}{{ d.get('zz') }}",
     {"d": {"a": 1, "b": "two", "items": "key"}, "l": [10, 20, 30]}),
    ("slices", "{{ l[1:] }}{{ l[:-1] }}{{ l[::-1] }}{{ l[::2] }}{{ l[5:] }}{{ s[1:3] }}{{ s[::-1] }}{{ s[-2:] }}",
     {"l": [1, 2, 3, 4], "s": "héllo"}),
    ("for_loop_vars", "{% for x in xs %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.length }}/{{ loop.revindex }}/{{ loop.first }}/{{ loop.last }}/{{ loop.previtem }}/{{ loop.nextitem }};{% endfor %}",
     {"xs": ["a", "b", "c"]}),
    ("for_else_filter", "{% for x in [] %}x{% else %}empty{% endfor %}|{% for x in range(10) if x % 3 == 0 %}{{ x }}{{ '/' ~ loop.length }} {% endfor %}", {}),
    ("for_unpack_dict", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}{% for a, b in d | items %}{{ a }}{{ b }}{% endfor %}",
     {"d": {"x": 1, "y": [2]}}),
    ("for_string", "{% for ch in 'hé!' %}[{{ ch }}]{% endfor %}", {}),
    ("break_continue", "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %}", {}),
    ("scoping", "{% set x = 5 %}{% for i in [1, 2] %}{{ x }}{% set x = i %}{{ x }}{% endfor %}[{{ x }}]{% if true %}{% set y = 7 %}{% endif %}{{ y }}", {}),
    ("namespace", "{% set ns = namespace(n=0, s='') %}{% for i in range(4) %}{% set ns.n = ns.n + i %}{% set ns.s = ns.s ~ i %}{% endfor %}{{ ns.n }}|{{ ns.s }}", {}),
    ("set_block_tuple", "{% set t %}in {{ 'block' }}{% endset %}[{{ t }}]{% set a, b = 1, 2 %}{{ a }}{{ b }}", {}),
    ("macro", "{% macro m(a, b=2) %}[{{ a }}{{ b }}]{% endmacro %}{{ m(1) }}{{ m(1, b=3) }}{{ m('x', 'y') }}", {}),
    ("macro_recursive", "{% macro walk(v) %}{% if v is mapping %}{% for k in v %}{{ k }}({{ walk(v[k]) }}){% endfor %}{% else %}{{ v }}{% endif %}{% endmacro %}{{ walk(d) }}",
     {"d": {"a": {"b": 1, "c": {"d": 2}}}}),
    ("tests", "{{ 3 is divisibleby 3 }}{{ [1] is sequence }}{{ 'a' is iterable }}{{ {} is mapping }}{{ none is none }}{{ x is defined }}{{ 1 is number }}{{ 1.0 is float }}{{ true is boolean }}{{ 'a' is string }}{{ 2 is even }}{{ 3 is odd }}{{ 'ab' is lower }}{{ 1 is integer }}{{ 'a' is in 'abc' }}{{ 2 is eq 2 }}{{ 3 is gt 2 }}{{ none is sameas none }}{{ x is not defined }}{{ 'x' is not string }}",
     {}),
    ("filters_str", "{{ '  x  ' | trim }}|{{ 'xxhixx' | trim('x') }}|{{ 'aBc' | upper }}{{ 'aBc' | lower }}|{{ 'hello world' | capitalize }}|{{ 'hello-world x' | title }}|{{ 'a-b-c' | replace('-', '+') }}|{{ 'aaa' | replace('a', 'b', 2) }}|{{ 42 | string }}{{ none | string }}|{{ 'héllo' | length }}|{{ '<a&\"b\">' | e }}",
     {}),
    ("filters_seq", "{{ [3, 1, 2] | first }}{{ [3, 1, 2] | last }}|{{ [3, 1, 2] | sort }}{{ ['b', 'A', 'c'] | sort }}{{ [3, 1, 2] | sort(reverse=true) }}|{{ [1, 2, 1] | unique | list }}|{{ [1, 2] | reverse | list }}|{{ [1, 2, 3] | join(', ') }}|{{ {'a': 1} | list }}|{{ [1, 2, 3] | sum }}{{ [4, 2, 9] | min }}{{ [4, 2, 9] | max }}|{{ 'abc' | list }}",
     {}),
    ("filters_default", "{{ x | default('dflt') }}|{{ none | default('dflt') }}|{{ '' | default('dflt', true) }}|{{ 0 | d(5) }}|{{ y | default }}", {}),
    ("filters_num", "{{ '42' | int }}{{ '4.7' | int }}{{ 'x' | int }}{{ 'x' | int(7) }}{{ 3.9 | int }}|{{ '2.5' | float }}{{ 3 | float }}|{{ -3 | abs }}", {}),
    ("filters_select", "{{ xs | selectattr('type', 'equalto', 'text') | map(attribute='text') | join('+') }}|{{ xs | rejectattr('type', 'equalto', 'text') | list | length }}|{{ xs | map(attribute='text', default='?') | list }}|{{ [1, 0, 2, none] | select | list }}|{{ [1, 2, 3, 4] | reject('odd') | list }}|{{ ['a', 'B'] | map('upper') | list }}|{{ xs | selectattr('text') | list | count }}",
     {"xs": [{"type": "text", "text": "hi"}, {"type": "image"}, {"type": "text", "text": "yo"}]}),
    ("tojson", "{{ x | tojson }}|{{ x | tojson(indent=2) }}|{{ x | tojson(sort_keys=true) }}|{{ x | tojson(separators=(',', ':')) }}|{{ 'é\"\\n\\u0001' | tojson }}|{{ [] | tojson(indent=4) }}",
     {"x": {"b": [1, 2.5, 1e-07, 1e16, True, None], "a": {"c": "d"}, "e": {}}}),
    ("str_methods", "{{ '  a b  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '\\n\\na\\n'.lstrip('\\n') }}|{{ 'a\\n\\n'.rstrip() }}|{{ 'a,b,,c'.split(',') }}{{ ' a  b '.split() }}{{ 'a,b,c'.split(',', 1) }}|{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith(('x', 'c')) }}|{{ 'aBc'.upper() }}{{ 'aBc'.lower() }}|{{ 'a-a'.replace('a', 'b') }}|{{ 'hello world'.title() }}|{{ 'abcb'.find('b') }}{{ 'abcb'.count('b') }}|{{ '-'.join(['x', 'y']) }}",
     {}),
    ("unicode_strip", "[{{ '\u3000x\xa0' | trim }}][{{ '\u2003y\u2003'.strip() }}]", {}),
    ("dict_methods", "{{ d.keys() | list }}{{ d.values() | list }}{{ d.items() | list }}", {"d": {"a": 1, "b": 2}}),
    ("print_values", "{{ d }}|{{ l }}|{{ none }}|{{ true }}|{{ undefined_var }}|{{ \"it's\" }}|{{ ['it\\'s', \"q\\\"\"] }}", {"d": {"a": [1, {"b": None}]}, "l": [1.5, "x"]}),
    ("range_fn", "{{ range(3) | list }}{{ range(1, 7, 2) | list }}{{ range(5, 0, -2) | list }}", {}),
    ("dict_global", "{{ dict(a=1, b='x') }}", {}),
    ("raw_block", "{% raw %}{{ not evaluated }}{% endraw %}!", {}),
    ("raise", "{% if messages | length == 0 %}{{ raise_exception('No messages given!') }}{% endif %}ok", {"messages": []}),
    ("undefined_attr_error", "{{ nothing.attr }}", {}),
    ("type_error", "{{ 'x' + 1 }}", {}),
    ("div_zero", "{{ 1 / 0 }}", {}),
]


def main():
    cases = []
    hf_used = False
    for stem, (bos, eos, extra) in FAMILIES.items():
        source = open(os.path.join(DATA, "templates", stem + ".jinja"), encoding="utf-8").read()
        for conv, (msgs, kw) in CONVS.items():
            for agp in (True, False):
                if agp is False and conv not in ("multi_turn", "ends_with_assistant", "tool_call_str_args"):
                    continue
                ctx = {"messages": msgs, "tools": kw.get("tools"), "documents": None,
                       "add_generation_prompt": agp, "bos_token": bos, "eos_token": eos}
                ctx.update(extra)
                ctx.update({k: v for k, v in kw.items() if k != "tools"})
                got = render(source, ctx)
                hf_used |= hf_check(source, ctx, got)
                cases.append({"name": f"{stem}/{conv}/{'gen' if agp else 'nogen'}", "template": stem,
                              "context": ctx, **got})
    for name, source, ctx in FEATURES:
        got = render(source, ctx)
        cases.append({"name": f"feature/{name}", "source": source, "context": ctx, **got})
    with open(os.path.join(DATA, "cases.json"), "w", encoding="utf-8") as f:
        json.dump({"generator": "tools/make_jinja_fixtures.py", "jinja2": jinja2.__version__,
                   "cross_checked_with_transformers": hf_used, "cases": cases}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    n_err = sum(1 for c in cases if "error" in c)
    print(f"{len(cases)} cases ({n_err} expected errors), jinja2 {jinja2.__version__}, "
          f"transformers cross-check: {'yes' if hf_used else 'no'}")


if __name__ == "__main__":
    main()
