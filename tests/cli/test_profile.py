"""strata profile and --adapt-every, end to end through the binary: routing
counts of a MoE model on a text, and what they buy as --expert-profile; and
the cache learning the same while it runs.

A tiny qwen3moe synth with a Zipf-skewed router (so that a few experts take
most of the routing, as in real models) is profiled on the Genesis text;
the file must hold one count per (layer, expert), adding up to tokens x
top-k x layers. With a quarter of the experts cached, the profile's choice
must hit more often than the default one (each layer's lowest ids) on the
same prompt: the speed line's share of (token, expert) pairs served by the
cache; so must the cache that learns as it decodes (--adapt-every 1). On this CPU-only build the cache lives on a second CPU backend
standing in for the GPU (docs/offload.md). Bad uses end with a message and
exit code 1 or 2.
"""
import os
import re
import subprocess
from pathlib import Path

import pytest

BIN = os.environ.get("STRATA_BIN", "strata")
TMP = Path(os.environ.get("STRATA_TMP", "/tmp"))
ROOT = Path(__file__).resolve().parents[2]
TEXT = ROOT / "tests" / "data" / "text" / "kjv-genesis.txt"
SMOL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
LAYERS, EXPERTS, TOPK, CTX, CHUNKS = 4, 32, 4, 128, 6


def strata(*args, timeout=120):
    r = subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, timeout=timeout)
    assert r.returncode >= 0, f"strata {' '.join(map(str, args))} died by signal {-r.returncode}:\n{r.stderr}"
    return r


@pytest.fixture(scope="module")
def model():
    path = TMP / "profile-zipf.gguf"
    r = strata("synth", "--preset", "tiny", "--zipf", "1.0", "--layers", LAYERS, "--experts", EXPERTS,
               "--experts-used", TOPK, "-o", path, "--quiet")
    assert r.returncode == 0, r.stderr
    return path


@pytest.fixture(scope="module")
def profile(model):
    out = TMP / "profile-zipf.prof"
    r = strata("profile", "-m", model, "-f", TEXT, "-o", out, "--ctx", CTX, "--chunks", CHUNKS, "-t", 2)
    assert r.returncode == 0, r.stderr
    return out, r.stdout


def test_profile_file(profile):
    out, stdout = profile
    lines = out.read_text().splitlines()
    assert lines[0] == "strata-expert-profile 1"
    assert lines[1].split() == [str(LAYERS), str(EXPERTS)]
    rows = [[int(x) for x in line.split()] for line in lines[2:]]
    assert len(rows) == LAYERS and all(len(r) == EXPERTS for r in rows), lines[2:]
    tokens = int(re.search(r"profile: (\d+) tokens in (\d+) chunks", stdout).group(1))
    assert tokens == CTX * CHUNKS, stdout
    for layer, row in enumerate(rows):
        assert sum(row) == tokens * TOPK, f"layer {layer}: {sum(row)} routings for {tokens} tokens, top-{TOPK}"
    share = [float(x) for x in re.findall(r"take ([\d.]+)% of the routing", stdout)]
    assert len(share) == 3 and share[0] <= share[1] <= share[2] <= 100.0, stdout
    # a Zipf router: the hottest tenth of the experts takes far more than a tenth of the routing
    assert share[0] > 30.0, stdout
    print(f"checked: {LAYERS} x {EXPERTS} counts adding to {tokens} x {TOPK} per layer; hottest 10/25/50%: {share}")


def cached_share(model, *extra):
    r = strata("run", "-m", model, "-p", "In the beginning God created the heaven and the earth", "-n", 24,
               "--temp", 0, "-t", 2, "--expert-cache", LAYERS * EXPERTS // 4, *extra)
    assert r.returncode == 0, r.stderr
    m = re.search(r"experts ([\d.]+)% GPU cache \+ ([\d.]+)% CPU lane \+ ([\d.]+)% PCIe", r.stderr)
    assert m, r.stderr
    return float(m.group(1)), r.stdout


def test_profile_raises_the_hit_rate(model, profile):
    plain, text_plain = cached_share(model, "--adapt-every", 0)
    hot, text_hot = cached_share(model, "--expert-profile", profile[0], "--adapt-every", 0)
    assert hot > plain, f"cached pairs: {hot}% with the profile, {plain}% without"
    assert text_hot == text_plain, "the cached experts changed the greedy text"
    # learning (the default) from the profile's cache: recent routing may move a few slots, most of the
    # profile's hits stay (measured 98.6% against 100% over these 24 tokens, 99.8% over 200)
    learnt, text_learnt = cached_share(model, "--expert-profile", profile[0])
    assert learnt >= 0.95 * hot, f"cached pairs: {learnt}% learning from the profile, {hot}% with it fixed"
    assert text_learnt == text_plain
    print(f"checked: a quarter of the experts cached: {plain}% of pairs hit without a profile, {hot}% with it")


def test_profile_bad_uses(model, profile, tmp_path):
    r = strata("profile", "-m", model, "-f", TEXT)
    assert r.returncode == 2 and "missing -o" in r.stderr, r.stderr
    for cache in ("8", "auto"):
        r = strata("profile", "-m", model, "-f", TEXT, "-o", tmp_path / "x", "--expert-cache", cache)
        assert r.returncode == 2 and "do not apply" in r.stderr, r.stderr
    r = strata("profile", "-m", model, "-f", tmp_path / "absent.txt", "-o", tmp_path / "x")
    assert r.returncode == 1 and "cannot read" in r.stderr, r.stderr
    r = strata("profile", "-m", model, "-f", TEXT, "-o", tmp_path / "no" / "such" / "dir")
    assert r.returncode == 1 and "cannot write" in r.stderr, r.stderr
    if SMOL.exists():
        r = strata("profile", "-m", SMOL, "-f", TEXT, "-o", tmp_path / "x", "--chunks", 1)
        assert r.returncode == 1 and "not a mixture-of-experts" in r.stderr, r.stderr
    # a profile of another shape is refused at start, naming both shapes
    other = tmp_path / "other.prof"
    other.write_text("strata-expert-profile 1\n2 8\n" + "1 " * 15 + "1\n")
    r = strata("run", "-m", model, "-p", "x", "-n", 1, "--expert-cache", 8, "--expert-profile", other)
    assert r.returncode == 1 and "a profile of 2 layers x 8 experts" in r.stderr, r.stderr
    print("checked: missing -o, a cache with profile, an absent text, an unwritable output, a dense model, "
          "a profile of another shape")


def test_adapt_raises_the_hit_rate(model):
    plain, text_plain = cached_share(model, "--adapt-every", 0)
    learnt, text_learnt = cached_share(model)  # the default: learning every step
    assert learnt > plain, f"cached pairs: {learnt}% learning, {plain}% fixed"
    assert text_learnt == text_plain, "the cache's learning changed the greedy text"
    print(f"checked: a quarter of the experts cached: {plain}% of pairs hit with a fixed cache, {learnt}% learning")
