"""strata run / chat / perplexity / bench, end to end through the real binary.

Drives STRATA_BIN on the default model (models/SmolLM2-135M-Instruct.Q4_1.gguf,
fetched by scripts/fetch-models.sh; the tests SKIP without it): a greedy
continuation that names Paris, the speed line in DESIGN.md's format, seeds
(same seed -> same text, other seeds -> other text), --stop and -n, the KV
cache in int8, a two-turn chat through stdin whose second prompt reuses the
first turn, perplexity and bench output, and a table of bad inputs that must
each end with a clear message on stderr and exit code 1 or 2, never a signal.
Everything runs with small -n and small contexts (2 shared cores).
"""
import math
import os
import re
import subprocess
from pathlib import Path

import pytest

import gguf

BIN = os.environ.get("STRATA_BIN", "strata")
TMP = Path(os.environ.get("STRATA_TMP", "/tmp"))
ROOT = Path(__file__).resolve().parents[2]
SMOL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA = ROOT / "models" / "gemma-3-270m-q4_k_m.gguf"
TEXT = ROOT / "tests" / "data" / "text" / "kjv-genesis.txt"

# DESIGN.md, "Speed is reported the same way everywhere"
SPEED = re.compile(r"prompt (\d+) tokens = (\d+) reused \+ (\d+) read in [\d.]+ ms \([\d.]+ tok/s\), "
                   r"(\d+) generated in [\d.]+ ms \([\d.]+ tok/s\), drafts accepted \d+ of \d+")

need_smol = pytest.mark.skipif(not SMOL.exists(), reason=f"{SMOL} missing (scripts/fetch-models.sh)")


def strata(*args, stdin=None, timeout=120):
    r = subprocess.run([BIN, *map(str, args)], input=stdin, capture_output=True, text=True, timeout=timeout)
    # a negative code is a signal (crash, abort): never acceptable
    assert r.returncode >= 0, f"strata {' '.join(map(str, args))} died by signal {-r.returncode}:\n{r.stderr}"
    return r


def speed_lines(stderr):
    return [tuple(int(g) for g in m.groups()) for m in SPEED.finditer(stderr)]


def run_ok(*args, model=SMOL):
    """strata run that must succeed; returns (the text: prompt + continuation,
    without the newline run adds at the end; the one speed line's numbers)."""
    r = strata("run", "-m", model, *args)
    assert r.returncode == 0, r.stderr
    assert r.stdout.endswith("\n"), r.stdout
    lines = speed_lines(r.stderr)
    assert len(lines) == 1, f"expected one speed line on stderr, got:\n{r.stderr}"
    n_prompt, reused, read, n_gen = lines[0]
    assert n_prompt == reused + read and n_prompt > 0
    return r.stdout[:-1], lines[0]


@need_smol
def test_greedy_paris_and_speed_line():
    prompt = "The capital of France is"
    out, (n_prompt, reused, read, n_gen) = run_ok("-p", prompt, "-n", 8, "--temp", 0)
    print(f"greedy: {out!r}; {n_prompt} prompt tokens, {n_gen} generated")
    assert out.startswith(prompt)
    assert "Paris" in out[len(prompt):]
    assert reused == 0 and 1 <= n_gen <= 8
    # greedy is deterministic and -n is an upper bound: -n 3 is a prefix of -n 8
    short, (_, _, _, n3) = run_ok("-p", prompt, "-n", 3, "--temp", 0)
    print(f"-n 3: {short!r}, {n3} generated")
    assert n3 <= 3
    assert out.startswith(short)


@need_smol
def test_kv_int8():
    out, (_, _, _, n_gen) = run_ok("-p", "The capital of France is", "-n", 8, "--temp", 0, "--kv", "int8")
    print(f"--kv int8: {out!r}")
    assert "Paris" in out and 1 <= n_gen <= 8


@need_smol
def test_seeds():
    args = ("-p", "Once upon a time", "-n", 12, "--temp", 0.8)
    a, _ = run_ok(*args, "--seed", 1)
    b, _ = run_ok(*args, "--seed", 1)
    others = [run_ok(*args, "--seed", s)[0] for s in (2, 3)]
    print(f"seed 1 twice: {a!r}; seeds 2, 3: {others!r}")
    assert a == b
    # one of two other seeds giving the same 12 tokens at T 0.8 would be a broken seed
    assert any(o != a for o in others)


@need_smol
def test_stop_string():
    prompt = "The capital of France is"
    full, _ = run_ok("-p", prompt, "-n", 12, "--temp", 0)
    cont = full[len(prompt):]
    # stop at the second word of the greedy continuation, and at a piece that
    # starts inside that word and spans later tokens: the output ends just before it
    words = re.findall(r"\w{3,}", cont)
    assert len(words) >= 2, f"continuation too short for a stop test: {cont!r}"
    at = cont.index(words[1])
    for stop in (words[1], cont[at + 1:at + 10]):
        cut = cont.index(stop)
        out, (_, _, _, n_gen) = run_ok("-p", prompt, "-n", 12, "--temp", 0, "--stop", stop)
        print(f"--stop {stop!r}: {out!r}, {n_gen} generated (without: {full!r})")
        assert out == prompt + cont[:cut]
        assert n_gen < 12


@need_smol
def test_families():
    r = strata("--families")
    assert r.returncode == 0, r.stderr
    fams = r.stdout.split()
    print(f"--families: {fams}")
    for f in ("llama", "qwen2", "qwen3", "qwen3moe", "gemma3"):
        assert f in fams


@pytest.mark.skipif(not GEMMA.exists(), reason=f"{GEMMA} missing")
def test_gemma_runs():
    out, (_, _, _, n_gen) = run_ok("-p", "The capital of France is", "-n", 4, "--temp", 0, "--ctx", 64, model=GEMMA)
    print(f"gemma3: {out!r}, {n_gen} generated")
    assert n_gen >= 1 and len(out) > len("The capital of France is")


@need_smol
def test_chat_two_turns():
    r = strata("chat", "-m", SMOL, "-n", 8, "--temp", 0, "--ctx", 256, stdin="My name is Ada.\nWhat is my name?\n")
    assert r.returncode == 0, r.stderr
    lines = speed_lines(r.stderr)
    print(f"chat: stdout {r.stdout!r}; speed lines {lines}")
    assert len(lines) == 2
    # the second turn's prompt holds the first turn: longer, and read on top of the cached first turn
    (p1, _, _, g1), (p2, reused2, _, _) = lines
    assert p2 > p1 + 5
    assert reused2 >= p1 // 2
    assert r.stdout.count("> ") >= 2


@need_smol
def test_chat_context_overflow():
    # the second turn's history (about 38 tokens) outgrows --ctx 24: a message and exit 1
    r = strata("chat", "-m", SMOL, "-n", 8, "--temp", 0, "--ctx", 24, stdin="My name is Ada.\nWhat is my name?\n")
    print(f"chat over --ctx 24: exit {r.returncode}; {r.stderr.strip().splitlines()[-1]}")
    assert r.returncode == 1
    assert len(speed_lines(r.stderr)) == 1
    assert "beyond the context of 24 tokens" in r.stderr


@need_smol
def test_perplexity():
    text = TMP / "clitest_ppl.txt"
    text.write_text(TEXT.read_text(encoding="utf-8")[:4000] if TEXT.exists() else
                    "The quick brown fox jumps over the lazy dog. " * 80, encoding="utf-8")
    r = strata("perplexity", "-m", SMOL, "-f", text, "--ctx", 128, "--chunks", 2)
    assert r.returncode == 0, r.stderr
    m = re.search(r"Final estimate: PPL = ([0-9.eE+-]+|nan|inf)", r.stdout + r.stderr)
    assert m, r.stdout + r.stderr
    ppl = float(m.group(1))
    print(f"perplexity (2 chunks of 128): {ppl}")
    # finite; far below the vocabulary size (49152) that a broken model scores
    assert math.isfinite(ppl) and 1.0 < ppl < 500.0


@need_smol
def test_bench():
    r = strata("bench", "-m", SMOL, "-p", 32, "-n", 8, "-r", 1)
    assert r.returncode == 0, r.stderr
    out = r.stdout + r.stderr
    print(out)
    pp = re.search(r"^pp32: ([\d.]+) tok/s", out, re.M)
    tg = re.search(r"^tg8: ([\d.]+) tok/s", out, re.M)
    assert pp and tg, out
    assert float(pp.group(1)) > 0 and float(tg.group(1)) > 0
    # on the CPU, decode against the read bandwidth measured beside it: GB/s x 100 / bandwidth = the share
    m = re.search(r"^tg8: [\d.]+ tok/s, ([\d.]+) GB/s of weights = (\d+)% of the ([\d.]+) GB/s that (\d+) threads? "
                  r"read here", out, re.M)
    assert m, out
    gbs, pct, bw = float(m.group(1)), int(m.group(2)), float(m.group(3))
    assert bw > 0 and abs(100 * gbs / bw - pct) <= 1, out
    # the prompt against the cores' int8 rate: the multiply-adds per token are
    # the layers' matrices (rows x columns, read here with the gguf package)
    macs = sum(int(t.shape[0]) * int(t.shape[1]) for t in gguf.GGUFReader(str(SMOL)).tensors
               if t.name.startswith("blk.") and len(t.shape) == 2)
    m = re.search(r"^pp32: ([\d.]+) tok/s, ([\d.]+) GMAC/s in the layers' weight products(?: = (\d+)% of the "
                  r"([\d.]+) GMAC/s that (\d+) thread(?:'s|s') (\w+) int8 units do here| \(no SIMD int8 path on this CPU\))$",
                  out, re.M)
    assert m, out
    tps, gmacs = float(m.group(1)), float(m.group(2))
    assert abs(gmacs - tps * macs / 1e9) <= 0.05 + 1e-3 * gmacs, (gmacs, tps, macs)
    if m.group(3):
        pct, rate = int(m.group(3)), float(m.group(4))
        assert rate > 0 and abs(100 * gmacs / rate - pct) <= 1, out
        assert m.group(6) in ("avx2", "avx512", "amx"), out


def write_mamba(path):
    w = gguf.GGUFWriter(str(path), "mamba")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(8)
    import numpy as np
    w.add_tensor("token_embd.weight", np.zeros((16, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


DRAFT_RE = re.compile(r"drafts accepted (\d+) of (\d+)")


def drafted_run(model, *args, env=None):
    r = subprocess.run([BIN, "run", "-m", str(model), *map(str, args)], capture_output=True, text=True, timeout=120,
                       env=env)
    assert r.returncode == 0, r.stderr
    m = DRAFT_RE.search(r.stderr)
    assert m, r.stderr
    return r.stdout, int(m.group(1)), int(m.group(2))


@pytest.mark.parametrize("arch", ["qwen3moe", "qwen35moe"])
def test_drafts_give_the_plain_tokens(arch, tmp_path):
    """--draft ngram (prompt lookup, verified in one batched pass): with f32
    activations (STRATA_PRECISE=1: a batched product then rounds as a
    one-token one) the greedy text is the plain decoder's byte for byte, and
    on a repetitive text drafts are accepted. A model with a recurrent state
    (qwen35moe) rolls its DeltaNet state back to the accepted tokens; its
    random weights seldom repeat the prompt, so its prompt is its own greedy
    continuation followed by the prompt again, whose drafts are partly right
    (tests/engine/test_drafts.c checks the rollback itself)."""
    model = tmp_path / "m.gguf"
    r = subprocess.run([BIN, "synth", "--arch", arch, "--preset", "tiny", "-o", model, "--quiet"], capture_output=True,
                       text=True, timeout=60) if arch != "qwen3moe" else \
        subprocess.run([BIN, "synth", "--preset", "tiny", "-o", model, "--quiet"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    env = dict(os.environ, STRATA_PRECISE="1")
    prompt = "one two three four one two three four one two three four"
    if arch == "qwen35moe":
        cont = drafted_run(model, "-p", prompt, "-n", 32, "--temp", 0, env=env)[0].replace("\0", "").strip()
        prompt = cont + " " + prompt
    plain, a0, t0 = drafted_run(model, "-p", prompt, "-n", 48, "--temp", 0, env=env)
    drafted, acc, tot = drafted_run(model, "-p", prompt, "-n", 48, "--temp", 0, "--draft", "ngram", env=env)
    assert (a0, t0) == (0, 0)
    assert drafted == plain, "drafts changed the greedy text"
    assert 0 < acc <= tot, (acc, tot)
    # sampling: the same seed gives the same text with and without drafts (each position samples as the
    # plain decoder would, a draft is kept only where it is what was sampled)
    s_plain = drafted_run(model, "-p", prompt, "-n", 32, "--temp", 0.8, "--seed", 7, env=env)[0]
    s_draft = drafted_run(model, "-p", prompt, "-n", 32, "--temp", 0.8, "--seed", 7, "--draft-n", 4, env=env)[0]
    assert s_draft == s_plain, "drafts changed the sampled text"
    print(f"checked: {arch}: greedy text equal with drafts, {acc} of {tot} drafted tokens accepted")


def test_mtp_drafts_give_the_plain_tokens(tmp_path):
    """--draft mtp (the model's multi-token prediction block drafts, one
    batched pass verifies): on a tiny qwen35moe written with the block (synth
    --mtp), STRATA_PRECISE=1, the greedy text of several prompts is the plain
    decoder's byte for byte, and the speed line counts the drafts (a random
    block seldom guesses right: tests/engine/test_mtp.c has accepted ones).
    A file without the block refuses --draft mtp (tests/server/test_drafts.py
    has the server's MTP drafts)."""
    model, bare = tmp_path / "mtp.gguf", tmp_path / "bare.gguf"
    for path, extra in ((model, ["--mtp"]), (bare, [])):
        r = subprocess.run([BIN, "synth", "--arch", "qwen35moe", "--preset", "tiny", "-o", path, "--quiet", *extra],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
    env = dict(os.environ, STRATA_PRECISE="1")
    total = 0
    for prompt in ("one two three four one two three four", "The quick brown fox", "x"):
        plain, a0, t0 = drafted_run(model, "-p", prompt, "-n", 32, "--temp", 0, env=env)
        drafted, acc, tot = drafted_run(model, "-p", prompt, "-n", 32, "--temp", 0, "--draft", "mtp", env=env)
        assert (a0, t0) == (0, 0)
        assert drafted == plain, f"MTP drafts changed the greedy text of {prompt!r}"
        assert 0 <= acc <= tot
        total += tot
    assert total > 0
    r = subprocess.run([BIN, "run", "-m", str(bare), "-p", "hi", "-n", "4", "--draft", "mtp"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1 and "no usable multi-token prediction block" in r.stderr, r.stderr
    print(f"checked: qwen35moe --mtp: greedy text equal with MTP drafts, {total} drafted tokens")


LONG = " ".join(["word"] * 60)
# (case, args after "run", expected exit code, text the error message must contain)
BAD = [
    ("empty prompt", ["-m", SMOL, "-p", ""], 2, "the prompt is empty"),
    ("empty prompt, BOS model", ["-m", GEMMA, "-p", ""], 2, "the prompt is empty"),
    ("prompt beyond ctx", ["-m", SMOL, "--ctx", 16, "-p", LONG], 1, "beyond the context of 16 tokens"),
    ("ctx beyond training", ["-m", SMOL, "--ctx", 1 << 20, "-p", "hi"], 1, "beyond the model's trained context"),
    ("mamba", ["-m", "MAMBA", "-p", "hi"], 1, "architecture 'mamba' is not supported"),
    ("missing file", ["-m", "/nonexistent/model.gguf", "-p", "hi"], 1, "cannot open"),
    ("not gguf", ["-m", "NOTGGUF", "-p", "hi"], 1, "not a GGUF file"),
    ("kv fp8", ["-m", SMOL, "-p", "hi", "--kv", "fp8"], 2, "invalid value 'fp8' for --kv"),
    ("ctx 0", ["-m", SMOL, "-p", "hi", "--ctx", 0], 2, "invalid value '0' for --ctx"),
    ("temp abc", ["-m", SMOL, "-p", "hi", "--temp", "abc"], 2, "invalid value 'abc' for --temp"),
    ("n 0", ["-m", SMOL, "-p", "hi", "-n", 0], 2, "invalid value '0' for -n"),
    ("unknown option", ["-m", SMOL, "-p", "hi", "--bogus"], 2, "unknown option '--bogus'"),
    ("value missing", ["-m", SMOL, "-p"], 2, "-p"),
    ("no prompt", ["-m", SMOL], 2, "missing -p"),
    ("draft kind", ["-m", SMOL, "-p", "hi", "--draft", "mtp2"], 2, "invalid value 'mtp2' for --draft"),
    ("draft n 0", ["-m", SMOL, "-p", "hi", "--draft-n", 0], 2, "invalid value '0' for --draft-n"),
]


@need_smol
@pytest.mark.parametrize("case,args,code,msg", BAD, ids=[b[0] for b in BAD])
def test_bad_input(case, args, code, msg):
    if GEMMA in args and not GEMMA.exists():
        pytest.skip(f"{GEMMA} missing")
    mamba, notgguf = TMP / "clitest_mamba.gguf", TMP / "clitest_not.gguf"
    if "MAMBA" in args:
        write_mamba(mamba)
    if "NOTGGUF" in args:
        notgguf.write_text("plain text, not a model\n" * 4)
    args = [mamba if a == "MAMBA" else notgguf if a == "NOTGGUF" else a for a in args]
    r = strata("run", *args)
    first = (r.stderr.strip().splitlines() or [""])[0]
    print(f"{case}: exit {r.returncode}: {first}")
    assert r.returncode == code, r.stderr
    assert msg in r.stderr
    assert r.stderr.startswith("strata run: "), r.stderr
    assert not speed_lines(r.stderr)
