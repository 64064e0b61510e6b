"""strata perplexity --kl-divergence-base: llama.cpp's logits file, written and read.

Drives STRATA_BIN on SmolLM2-135M (models/, SKIP without it) over 2 chunks of
128 tokens of Genesis (126 scored positions: llama.cpp prints no summary under
100). The format is checked from Python, independently of Strata's reader:
the header and size, the tokens (decoded with the GGUF's own token strings
back to the text), and the rows' meaning (the stored log-probability of each
next token gives back the perplexity Strata printed; row 0 predicts token
ctx/2 + 1). Then Strata reads its file against itself (KLD ~0: the file is
16-bit, so not exactly 0; top-1 100%) and against perturbed runs (f32
activations, an int8 KV cache: KLD > 0 and small), and the KLD it prints is
recomputed from two files in NumPy. Mismatched and broken files must be
refused with a message naming both sides, exit code 1, never a signal.
The llama.cpp comparison is bench/kld_vs_llama.sh (needs a llama.cpp build).
"""
import os
import re
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

import gguf

BIN = os.environ.get("STRATA_BIN", "strata")
TMP = Path(os.environ.get("STRATA_TMP", "/tmp"))
ROOT = Path(__file__).resolve().parents[2]
SMOL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA = ROOT / "models" / "gemma-3-270m-q4_k_m.gguf"
TEXT = ROOT / "tests" / "data" / "text" / "kjv-genesis.txt"
CTX, CHUNKS = 128, 2
ROWS = CTX - 1 - CTX // 2  # scored positions per chunk

pytestmark = pytest.mark.skipif(not SMOL.exists(), reason=f"{SMOL} missing (scripts/fetch-models.sh)")


def strata(*args, env=None, timeout=120):
    r = subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, **(env or {})})
    assert r.returncode >= 0, f"strata {' '.join(map(str, args))} died by signal {-r.returncode}:\n{r.stderr}"
    return r


def ppl(*args, model=SMOL, env=None):
    return strata("perplexity", "-m", model, "-t", 2, *args, env=env)


def write_base(name, *extra, env=None):
    path = TMP / name
    r = ppl("-f", TEXT, "--ctx", CTX, "--chunks", CHUNKS, "--kl-divergence-base", path, *extra, env=env)
    assert r.returncode == 0, r.stderr
    m = re.search(r"Final estimate: PPL = ([\d.]+)", r.stdout)
    assert m, r.stdout
    return path, float(m.group(1))


def read_base(path, *extra, env=None, model=SMOL):
    r = ppl("--kl-divergence-base", path, "--kl-divergence", *extra, env=env, model=model)
    assert r.returncode == 0, r.stderr
    stats = {}
    for key, pat in (("ppl", r"Mean PPL\(Q\) +: +([-\d.]+)"), ("ppl_base", r"Mean PPL\(base\) +: +([-\d.]+)"),
                     ("kld", r"Mean +KLD: +([-\d.]+)"), ("kld_max", r"Maximum KLD: +([-\d.]+)"),
                     ("top", r"Same top p: +([\d.]+)")):
        m = re.search(pat, r.stdout)
        assert m, f"no {key} in:\n{r.stdout}"
        stats[key] = float(m.group(1))
    return stats


def parse(path):
    """The file as llama.cpp's tools/perplexity writes it (see src/cli/ppl_kld.h)."""
    b = path.read_bytes()
    assert b[:8] == b"_logits_"
    n_ctx, n_vocab, n_chunk = struct.unpack_from("<iii", b, 8)
    nv = 2 * ((n_vocab + 1) // 2) + 4
    rows = n_ctx - 1 - n_ctx // 2
    tokens = np.frombuffer(b, "<i4", n_chunk * n_ctx, 20).reshape(n_chunk, n_ctx)
    off = 20 + 4 * n_chunk * n_ctx
    assert len(b) == off + n_chunk * rows * nv * 2, "size differs from the header's"
    u16 = np.frombuffer(b, "<u2", n_chunk * rows * nv, off).reshape(n_chunk, rows, nv)
    head = np.frombuffer(u16[..., :4].tobytes(), "<f4").reshape(n_chunk, rows, 2)
    scale, min_lp = head[..., 0:1].astype(np.float64), head[..., 1:2].astype(np.float64)
    q = u16[..., 4:4 + n_vocab]
    return dict(n_ctx=n_ctx, n_vocab=n_vocab, n_chunk=n_chunk, tokens=tokens, q=q, pad=u16[..., 4 + n_vocab:],
                logp=scale * q + min_lp, scale=scale, min_lp=min_lp)


@pytest.fixture(scope="module")
def base():
    return write_base("kld_smol.kld")


def test_format(base):
    path, printed_ppl = base
    f = parse(path)
    reader = gguf.GGUFReader(SMOL)
    vocab = [bytes(reader.fields["tokenizer.ggml.tokens"].parts[i]).decode()
             for i in reader.fields["tokenizer.ggml.tokens"].data]
    print(f"header: ctx {f['n_ctx']}, vocab {f['n_vocab']}, {f['n_chunk']} chunks; {path.stat().st_size} bytes")
    assert (f["n_ctx"], f["n_vocab"], f["n_chunk"]) == (CTX, len(vocab), CHUNKS)
    # the tokens are the text's, in order (SmolLM2 adds no BOS): decode with the
    # GGUF's byte-level BPE strings (GPT-2's byte map: 'Ġ' space, 'Ċ' newline)
    byte_map = {c: b for b, c in zip(*_gpt2_bytes())}
    decoded = b"".join(bytes(byte_map[c] for c in vocab[t]) for t in f["tokens"].ravel()).decode("utf-8", "replace")
    text = TEXT.read_text()
    assert text.startswith(decoded), f"tokens decode to {decoded[:80]!r}, text starts {text[:80]!r}"
    assert len(decoded) > 500
    # rows: the top entry is 65535 (scale spans max..floor), the floor is <= 16 nats below,
    # the distribution sums to about 1, the padding (odd vocabularies) is 0
    assert (f["q"].max(axis=-1) == 65535).all()
    span = 65535 * f["scale"][..., 0]
    assert (span > 0).all() and (span <= 16 + 1e-3).all()
    mass = np.exp(f["logp"]).sum(axis=-1)
    print(f"row mass: {mass.min():.5f} .. {mass.max():.5f}")
    assert np.all(np.abs(mass - 1) < 2e-2)
    assert (f["pad"] == 0).all()
    # row i of chunk c holds position CTX/2 + i and predicts token CTX/2 + i + 1:
    # those log-probabilities give back the perplexity Strata printed
    nxt = f["tokens"][:, CTX // 2 + 1:]
    lp = np.take_along_axis(f["logp"], nxt[..., None].astype(np.int64), axis=-1)[..., 0]
    file_ppl = float(np.exp(-lp.mean()))
    wrong = float(np.exp(-np.take_along_axis(f["logp"], f["tokens"][:, CTX // 2:-1, None].astype(np.int64),
                                             axis=-1).mean()))
    print(f"PPL from the file {file_ppl:.4f}, printed {printed_ppl:.4f} (rows shifted by one: {wrong:.1f})")
    assert abs(file_ppl / printed_ppl - 1) < 1e-3
    assert abs(wrong / printed_ppl - 1) > 0.5


def _gpt2_bytes():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return bs, [chr(c) for c in cs]


def test_self(base):
    path, printed_ppl = base
    s = read_base(path, "-f", TEXT)
    print(f"self: {s}")
    # the 16-bit log-probabilities are the only difference: ~1e-7 per position
    assert abs(s["kld"]) < 1e-5 and s["kld_max"] < 1e-3
    assert s["top"] == 100.0
    assert abs(s["ppl"] / printed_ppl - 1) < 1e-4 and abs(s["ppl_base"] / printed_ppl - 1) < 1e-3


def test_perturbed(base):
    path, _ = base
    for name, extra, env in (("f32 activations", (), {"STRATA_PRECISE": "1"}), ("int8 KV", ("--kv", "int8"), None)):
        s = read_base(path, *extra, env=env)
        print(f"{name}: {s}")
        assert 1e-4 < s["kld"] < 0.05, name
        assert 85 < s["top"] < 100, name


def test_kld_matches_numpy(base):
    """Strata's printed KLD(base || run) against NumPy on two files: the run's
    own 16-bit file stands in for its logits (an error of ~1e-6)."""
    path, _ = base
    other, _ = write_base("kld_smol_precise.kld", env={"STRATA_PRECISE": "1"})
    s = read_base(path, env={"STRATA_PRECISE": "1"})
    a, b = parse(path), parse(other)
    lpa, lpb = a["logp"], b["logp"]
    keep = lpa > -16
    kld = (np.where(keep, np.exp(lpa) * (lpa - lpb), 0)).sum(axis=-1)
    top = (lpa.argmax(axis=-1) == lpb.argmax(axis=-1)).mean() * 100
    print(f"printed KLD {s['kld']:.6f} top {s['top']:.3f}%; NumPy {kld.mean():.6f} top {top:.3f}%")
    assert abs(kld.mean() - s["kld"]) < 0.02 * s["kld"] + 2e-6
    assert abs(top - s["top"]) <= 100 / kld.size + 1e-9  # one near-tie at most


def test_refusals(base):
    path, _ = base
    other_text = TMP / "kld_other.txt"
    other_text.write_text("In the beginning was the Word, and the Word was with God. " * 80)
    trunc = TMP / "kld_trunc.kld"
    trunc.write_bytes(path.read_bytes()[:-1000])
    bad = TMP / "kld_bad.kld"
    bad.write_bytes(b"_logitz_" + path.read_bytes()[8:4096])
    cases = [
        (("--kl-divergence-base", path, "--kl-divergence"), GEMMA, r"vocabulary of 49152 tokens.*has 262144"),
        (("--kl-divergence-base", path, "--kl-divergence", "-f", other_text), SMOL, r"differs.*kld_other.txt"),
        (("--kl-divergence-base", trunc, "--kl-divergence"), SMOL, r"kld_trunc.kld.*truncated"),
        (("--kl-divergence-base", bad, "--kl-divergence"), SMOL, r"kld_bad.kld.*not a llama.cpp"),
        (("--kl-divergence-base", path, "--kl-divergence", "--ctx", 256), SMOL, r"ctx 128, --ctx asks for 256"),
        (("--kl-divergence-base", path, "--kl-divergence", "--chunks", 3), SMOL, r"2 chunks, --chunks asks for 3"),
        (("--kl-divergence-base", TMP / "kld_missing.kld", "--kl-divergence"), SMOL, r"cannot open"),
    ]
    for args, model, pat in cases:
        if model == GEMMA and not GEMMA.exists():
            continue
        r = ppl(*args, model=model)
        print(f"{model.name} {' '.join(map(str, args[2:]))}: exit {r.returncode}: {r.stderr.strip()}")
        assert r.returncode == 1 and re.search(pat, r.stderr), (args, r.stderr)
    r = ppl("--kl-divergence")
    assert r.returncode == 2 and "--kl-divergence-base" in r.stderr
    r = ppl("--kl-divergence-base", TMP / "kld_x.kld")
    assert r.returncode == 2 and "-f TEXTFILE" in r.stderr
