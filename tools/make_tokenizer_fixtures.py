#!/usr/bin/env python3
"""Reference token ids for the tokenizer tests, from Hugging Face's tokenizers.

For each default model (scripts/fetch-models.sh puts them in models/) this
builds the tokenizer that transformers builds from the same GGUF file
(transformers.integrations.gguf: get_gguf_tokenizer + convert_gguf_tokenizer,
the path `from_pretrained(dir, gguf_file=name)` takes), encodes a fixed
multilingual corpus and writes tests/data/tokenizer/<model>.json:

    {"model": file name, "sha256": ..., "generator": versions,
     "cases": [{"text": s,
                "ids": encode(s) with the model's BOS/EOS rules and special
                       tokens recognised (HF's defaults),
                "ids_plain": encode(s) with no BOS/EOS and control-token
                       strings treated as plain text (split_special_tokens),
                "decoded": decode(ids_plain) with no clean-up,
                "roundtrip": decoded == s}, ...]}

The C test (tests/tokenizer/test_tokenizer.c) checks our ids against these.

Only needed to regenerate the committed fixtures; the tests do not run it.
Needs: pip install transformers tokenizers gguf numpy (no torch: see below).
Usage: python3 tools/make_tokenizer_fixtures.py [--models DIR] [--out DIR]
"""
import argparse
import hashlib
import json
import os
import sys
import types

MODELS = ["SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"]


def corpus():
    """The test strings: hand-written cases, then systematic runs and mixes."""
    s = [
        # English prose
        "Hello world",
        "Hello, world!",
        "The quick brown fox jumps over the lazy dog.",
        "It's a truth universally acknowledged, that a single man in possession of a good fortune, must be in want of a wife.",
        "I'm sure you'll like it; they've said we'd go, and she's right.",
        "DON'T SHOUT. I'M NOT DEAF, YOU'RE JUST LOUD!",
        "Mr. O'Neil's dog didn't bark at 3 a.m. — or did it?",
        "Once upon a time, in a land far, far away...",
        "a",
        "A",
        "I",
        " ",
        "",
        "Supercalifragilisticexpialidocious antidisestablishmentarianism",
        "e-mail: someone@example.com, web: https://example.org/path?q=1&r=two#frag",
        "Quotes: \"double\", 'single', `backtick`, «guillemets», „low”.",
        "Parentheses (like this) and [brackets] and {braces} and <angles>.",
        "Semicolons; colons: dashes - en – em — ellipsis … done.",
        "tab\tseparated\tvalues\there",
        "line one\nline two\nline three",
        "windows\r\nline\r\nendings\r\n",
        "trailing spaces   ",
        "   leading spaces",
        "  both  ",
        "multiple     spaces    between   words",
        "\n",
        "\n\n",
        "\n\n\n\n\n",
        "\t",
        "\t\t\n \n\t ",
        " \n \n ",
        "Hello\n\nWorld",
        "end of paragraph.\n\nNew paragraph starts here.\n",
        # digits
        "0",
        "7",
        "42",
        "123",
        "1234",
        "12345",
        "3.14159265358979",
        "1,000,000",
        "2024-06-01T12:34:56Z",
        "Call 555-0199 or +1 (800) 123-4567.",
        "version 1.2.3-rc4",
        "0x1F 0b1010 0o777 1e-9",
        "In 1969, 600 million people watched.",
        "٠١٢٣٤٥٦٧٨٩",
        "１２３ full-width digits",
        "Ⅻ roman numeral, ½ fraction, ² superscript",
        # code
        "def add(a, b):\n    return a + b\n",
        "for (int i = 0; i < n; i++) {\n\tsum += x[i];\n}",
        "#include <stdio.h>\nint main(void) { printf(\"hi\\n\"); return 0; }",
        "const x = () => { return [1, 2, 3].map(v => v * 2); };",
        "SELECT name, COUNT(*) FROM users WHERE age >= 21 GROUP BY name;",
        "<div class=\"main\"><p>Hello</p></div>",
        "</div></span></li>",
        "if x == 1:\n        pass\n    else:\n        raise ValueError('bad')",
        "    indented four\n        indented eight\n",
        "a_b_c snake_case camelCase PascalCase SCREAMING_CASE kebab-case",
        "git commit -m \"fix: handle edge cases\" && git push origin main",
        "{\"key\": [1, 2.5, null, true], \"nested\": {\"a\": \"b\"}}",
        "$ echo $HOME | grep -v '^#' > /dev/null 2>&1",
        "x+=1;y-=2;z*=3;w/=4;v%=5;u**=6",
        "fn main() { let v: Vec<u8> = vec![0; 16]; println!(\"{:?}\", v); }",
        "// comment\n/* block */\n# hash\n-- sql",
        "~!@#$%^&*()_+`-=[]\\{}|;':\",./<>?",
        # CJK
        "日本語のテキスト",
        "こんにちは、世界！",
        "東京は日本の首都です。",
        "カタカナとひらがなと漢字",
        "中文测试：你好，世界。",
        "我爱自然语言处理。",
        "繁體中文與简体中文",
        "한국어 텍스트입니다.",
        "안녕하세요 세계",
        "日本語 and English mixed 混合",
        # emoji and symbols
        "😀",
        "😀👍🏽",
        "👨‍👩‍👧‍👦 family",
        "🇯🇵🇺🇸🇫🇷 flags",
        "I ❤️ NY",
        "🔥🔥🔥 fire",
        "Math: ∑ ∫ √ ∞ ≠ ≤ ≥ ± × ÷ π",
        "Arrows ← ↑ → ↓ ⇒ ⇔",
        "Box drawing ┌─┐│└┘",
        "Currency: $ € £ ¥ ₹ ₿",
        "™ © ® ° § ¶ †",
        # Arabic, Hebrew and other scripts
        "مرحبا بالعالم",
        "السلام عليكم ورحمة الله",
        "اللغة العربية جميلة جداً.",
        "English then عربي then English",
        "שלום עולם",
        "Привет, мир!",
        "Съешь же ещё этих мягких французских булок.",
        "Γειά σου Κόσμε",
        "नमस्ते दुनिया",
        "สวัสดีชาวโลก",
        "Tiếng Việt có dấu",
        "Ærøskøbing Straße Ñandú çà et là",
        "naïve café résumé coöperate",
        "e\u0301 combining acute vs é precomposed",
        "ﬁ ligature and ｆｕｌｌ width",
        # unusual whitespace and controls
        "non\u00a0breaking\u00a0space",
        "ideographic\u3000space",
        "thin\u2009space and em\u2003space",
        "zero\u200bwidth\u200bspace",
        "line\u2028separator",
        "next\u0085line",
        "form\x0cfeed and vertical\x0btab",
        "bell\x07 and escape\x1b[0m",
        "soft\u00adhyphen",
        # lone characters of the byte-level alphabet and the SentencePiece space
        "Ġ Ċ ĉ",
        "▁",
        "▁x ▁▁y",
        "<0x0A>",
        "<unk>",
        # spellings of special tokens
        "<|im_start|>",
        "<|im_end|>",
        "<|endoftext|>",
        "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>system\nYou are helpful.<|im_end|>",
        "text<|endoftext|>more",
        "<|im_start|><|im_end|>",
        "<|im_start|",
        "|im_start|>",
        "<|im_start|> spaced <|im_end|>",
        "<start_of_turn>",
        "<end_of_turn>",
        "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n",
        "<start_of_turn>model\nSure!<end_of_turn>",
        "<bos>",
        "<eos>",
        "<bos>hello<eos>",
        "<pad><mask>",
        "<start_of_image>",
        "<repo_name>strata<file_sep>main.c",
        "<jupyter_code>print(1)<jupyter_output>1",
        "<think>reasoning</think>",
        "[multimodal]",
        "<<|im_start|>>",
        # mixed
        "Mixed: English, 日本語, العربية, русский, 😀, and code `x = 1`.",
        "The price is €12.50 (≈ $13.40) — cheap!",
        "Email me at test@test.io 📧 or call ☎ 555-1234.",
        "C'est l'été; j'ai 25 ans.",
        "¿Qué tal? ¡Muy bien!",
        "Ich heiße Jürgen und wohne in München.",
        "Tokyo東京2024年オリンピック🏅",
        "αβγ123ABCabc!@#",
        "R2-D2 and C-3PO",
        "H₂O and CO₂ and E=mc²",
        "...!!!???",
        "----------",
        "==========",
        "**bold** _italic_ ~~strike~~ `code`",
        "| a | b |\n|---|---|\n| 1 | 2 |",
        "1. first\n2. second\n3. third",
        "- item\n  - nested\n    - deeper",
        "> quoted text\n>> double quoted",
        "https://en.wikipedia.org/wiki/Byte_pair_encoding",
        "C:\\Users\\name\\Documents\\file.txt",
        "'s 't 're 've 'm 'll 'd",
        "'S 'T 'RE 'VE 'M 'LL 'D",
        "don't won't can't shouldn't",
        "it’s curly apostrophe",
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        "abababababababababababababab",
        "the the the the the the the the",
        "ThE qUiCk BrOwN fOx",
        "A" * 100,
        "z" * 257,
        " " * 40 + "x",
        "\n" * 40,
        "word " * 30,
        "😀" * 20,
        "日本" * 30,
        "a\u0300\u0301\u0302\u0303 stacked marks",
    ]
    # runs of spaces and newlines around words
    for k in range(1, 13):
        s.append("a" + " " * k + "b")
    for k in range(1, 8):
        s.append("x" + "\n" * k + "y")
    for k in range(1, 6):
        s.append(" " * k + "\n" + " " * k)
    for k in range(1, 5):
        s.append("\t" * k + "code")
    # digit strings of every length up to 12, and with separators
    for k in range(1, 13):
        s.append("".join(str((i * 7 + 3) % 10) for i in range(k)))
    for k in range(1, 7):
        s.append(" " + "9" * k + " apples")
    # the same sentence in several scripts, joined pairwise
    pieces = ["Good morning", "おはようございます", "صباح الخير", "Доброе утро", "早上好", "🌅", "42"]
    for i in range(len(pieces)):
        for j in range(len(pieces)):
            if i != j:
                s.append(pieces[i] + " " + pieces[j])
    # dedupe, keep order
    seen, out = set(), []
    for x in s:
        if x not in seen:
            seen.add(x)
            out.append(x)
    return out


def install_torch_stub():
    """transformers' GGUF reader imports torch at module level for the tensor
    dtypes it uses when loading weights; the tokenizer path never touches them.
    A placeholder module lets the tokenizer load without a multi-GB torch."""
    if "torch" in sys.modules:
        return

    class _Any:
        def __init__(self, *a, **k):
            pass

        def __getattr__(self, name):
            return _Any()

        def __call__(self, *a, **k):
            return _Any()

        def __or__(self, other):
            return self

        __ror__ = __or__

    stub = types.ModuleType("torch")
    stub.__getattr__ = lambda name: _Any
    sys.modules["torch"] = stub


def build(path):
    import transformers  # noqa: F401  (imported before the stub: it must see no torch)
    install_torch_stub()
    from transformers import PreTrainedTokenizerFast

    d, name = os.path.split(path)
    return PreTrainedTokenizerFast.from_pretrained(d or ".", gguf_file=name)


# transformers maps tokenizer.ggml.pre to a split regex for some names only;
# for the StarCoder family (SmolLM's "smollm") it falls back to plain GPT-2
# ByteLevel and drops the model's own first step, which puts every Unicode
# number (\p{N}: digits, but also "½", "²") in a piece of its own. The
# models' tokenizer.json and llama.cpp both have that step, so we restore it
# (it only changes strings with a number that is not an ASCII digit).
DIGITS_FIRST = {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"}


def fix_pre_tokenizer(tok, path):
    from gguf import GGUFReader
    from tokenizers import pre_tokenizers

    field = GGUFReader(path).fields.get("tokenizer.ggml.pre")
    pre = field.contents() if field is not None else ""
    if pre in DIGITS_FIRST:
        tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
            ]
        )
        return f"pre-tokenizer '{pre}': Digits(individual) + ByteLevel, as the model's tokenizer.json"
    return ""


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--models", default=os.path.join(root, "models"))
    ap.add_argument("--out", default=os.path.join(root, "tests", "data", "tokenizer"))
    args = ap.parse_args()
    import tokenizers
    import transformers

    os.makedirs(args.out, exist_ok=True)
    texts = corpus()
    for name in MODELS:
        path = os.path.join(args.models, name)
        tok = build(path)
        stock = [tok(t)["input_ids"] for t in texts]
        note = fix_pre_tokenizer(tok, path)
        n_fixed = sum(tok(t)["input_ids"] != ids for t, ids in zip(texts, stock))
        if note:
            note = f"; {note} (changes {n_fixed} strings vs transformers' own build)"
        cases = []
        for t in texts:
            ids = tok(t)["input_ids"]
            plain = tok(t, add_special_tokens=False, split_special_tokens=True)["input_ids"]
            dec = tok.decode(plain, skip_special_tokens=False, clean_up_tokenization_spaces=False)
            cases.append({"text": t, "ids": ids, "ids_plain": plain, "decoded": dec, "roundtrip": dec == t})
        doc = {
            "model": name,
            "sha256": sha256(path),
            "generator": f"transformers {transformers.__version__}, tokenizers {tokenizers.__version__}, "
            "tokenizer built from the GGUF metadata" + note,
            "cases": cases,
        }
        out = os.path.join(args.out, os.path.splitext(name)[0] + ".json")
        # one case a line, so that a regenerated fixture diffs case by case
        head = json.dumps({k: v for k, v in doc.items() if k != "cases"}, ensure_ascii=False)
        lines = ",\n".join(json.dumps(c, ensure_ascii=False) for c in cases)
        with open(out, "w", encoding="utf-8") as f:
            f.write(head[:-1] + ', "cases": [\n' + lines + "\n]}\n")
        n_rt = sum(c["roundtrip"] for c in cases)
        print(f"{out}: {len(cases)} strings, {n_rt} round-trip")


if __name__ == "__main__":
    main()
