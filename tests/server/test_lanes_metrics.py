"""The expert lanes through the server: a MoE model with part of its experts
cached (a tiny qwen3moe synth; on this CPU-only build a second CPU backend
stands in for the GPU, docs/offload.md) served by a real `strata serve`.
The server's engine gets --expert-cache and --pcie-frac through its
configuration frame; each finished request's (token, expert) pairs by lane
reach /metrics, adding up to the tokens evaluated x top-k x layers, and the
speed line in the log carries the same split."""
import os
import re
import subprocess

import pytest

from conftest import BIN, Server, httpx

LAYERS, EXPERTS, TOPK = 2, 16, 2


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    path = tmp_path_factory.mktemp("lanes") / "moe.gguf"
    r = subprocess.run([BIN, "synth", "--preset", "tiny", "--zipf", "1.0", "--layers", str(LAYERS), "--experts",
                        str(EXPERTS), "--experts-used", str(TOPK), "-o", str(path), "--quiet"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    s = Server("-m", str(path), "--expert-cache", "8", "--pcie-frac", "0", "-t", "2")
    yield s
    assert s.stop() == 0, s.log()[-3000:]


def metrics(server):
    text = httpx.get(server.url + "/metrics", timeout=10).text
    pairs = {m[0]: int(m[1]) for m in re.findall(r'strata_expert_pairs_total\{lane="(\w+)"\} (\d+)', text)}
    ratio = re.search(r"strata_expert_cache_hit_ratio ([\d.e+-]+)", text)
    return pairs, float(ratio.group(1)) if ratio else None


def test_pairs_by_lane(moe):
    before, _ = metrics(moe)  # empty until a request finished (the front end learns of the lanes then)
    r = httpx.post(moe.url + "/v1/completions", json={"prompt": "hello world", "max_tokens": 8, "temperature": 0},
                   timeout=60)
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    after, ratio = metrics(moe)
    assert set(after) == {"gpu_cache", "cpu", "pcie"}, after
    got = {k: after[k] - before.get(k, 0) for k in after}
    total = sum(got.values())
    # the prompt's tokens and every generated token but the last are evaluated
    evaluated = usage["prompt_tokens"] + usage["completion_tokens"] - 1
    assert total == evaluated * TOPK * LAYERS, (got, usage)
    assert got["pcie"] == 0 and got["gpu_cache"] > 0 and got["cpu"] > 0, got  # --pcie-frac 0, a cache of 8 of 32
    assert ratio is not None and 0 < ratio < 1, ratio
    line = [ln for ln in moe.lines if "experts" in ln and "GPU cache" in ln][-1]
    m = re.search(r"experts ([\d.]+)% GPU cache \+ ([\d.]+)% CPU lane \+ ([\d.]+)% PCIe", line)
    assert m and abs(float(m.group(1)) - 100 * got["gpu_cache"] / total) < 0.1, (line, got)
    print(f"checked: {total} pairs ({got}) = {evaluated} tokens x top-{TOPK} x {LAYERS} layers; hit ratio {ratio}")


def test_expert_map(moe, server):
    """GET /experts: the cache as the web page draws it, a cell per (layer, expert)."""
    r = httpx.post(moe.url + "/v1/completions", json={"prompt": "the cache", "max_tokens": 4, "temperature": 0},
                   timeout=60)
    assert r.status_code == 200, r.text
    j = httpx.get(moe.url + "/experts", timeout=10).json()
    assert j["offloaded"] is True and j["layers"] == LAYERS and j["experts"] == EXPERTS, j
    cells = j["cells"]
    assert len(cells) == LAYERS * EXPERTS and set(cells) <= set("01234567"), cells
    resident = sum(c >= "4" for c in cells)
    assert resident == j["resident"] == 8, j  # --expert-cache 8: the learning moves slots, never adds one
    heat = [int(c) % 4 for c in cells]
    for layer in range(LAYERS):  # every layer has a hottest expert, at the top level
        assert max(heat[layer * EXPERTS:(layer + 1) * EXPERTS]) == 3, cells
    assert httpx.post(moe.url + "/experts", json={}, timeout=10).status_code == 405
    # a dense model: nothing offloaded
    assert httpx.get(server.url + "/experts", timeout=10).json() == {"offloaded": False}
    print(f"checked: /experts {LAYERS} x {EXPERTS} cells, {resident} resident, a hottest expert in every layer")


def test_ssd_tier_bytes(moe):
    """--ram-budget through the configuration frame: a budget of the SSD
    tier's staging (a layer's 16 experts and a spare, 0.0023 GiB) and a few
    experts makes the rest come from the file (the SSD tier), whose bytes
    reach /metrics and the speed line."""
    path = moe.args[moe.args.index("-m") + 1]
    s = Server("-m", path, "--expert-cache", "4", "--pcie-frac", "0", "--ram-budget", "0.003", "-t", "2")
    try:
        r = httpx.post(s.url + "/v1/completions", json={"prompt": "hello world", "max_tokens": 8, "temperature": 0},
                       timeout=60)
        assert r.status_code == 200, r.text
        text = httpx.get(s.url + "/metrics", timeout=10).text
        m = re.search(r"strata_ssd_read_bytes_total ([\d.e+]+)", text)
        assert m and float(m.group(1)) > 0, text
        line = [ln for ln in s.lines if "SSD tier" in ln and "MB/token" in ln]
        assert line, s.log()[-3000:]
        print(f"checked: the SSD tier read {float(m.group(1)):.0f} bytes; {line[-1].split(', SSD tier')[-1]}")
    finally:
        assert s.stop() == 0, s.log()[-3000:]
