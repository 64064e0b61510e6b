"""strata launch, end to end through the binary.

The --plan numbers are checked against what the test reads itself: tensor
bytes and KV shape from the gguf package's reader of the same file, memory
from /proc/meminfo. The precedence of switches (DESIGN.md: "a switch you set
is never overridden"): flag > env > config > default, both for the value in
effect (the CPU kernels' ISA line, the context) and for who the plan says set
it. Bad config files must exit 2 with a message naming the file and the fault.
One real start serves with a config file and shows that a config switch
reaches the engine process.
"""
import json
import os
import re
import subprocess
import threading
import time
import urllib.request

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("STRATA_BIN", os.path.join(ROOT, "build", "bin", "strata"))
MODEL = os.environ.get("STRATA_MODEL", os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
TMP = os.environ.get("STRATA_TMP", "/tmp")
SWITCH_VARS = ["STRATA_ISA", "STRATA_LOG", "STRATA_PRECISE", "STRATA_API_KEY", "STRATA_SWITCH_SOURCES"]
ISAS = ["scalar", "avx2", "avx512", "amx"]


def need_model():
    if not os.path.exists(MODEL):
        pytest.skip(f"SKIPPED: {MODEL} is missing (run scripts/fetch-models.sh)")


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in SWITCH_VARS}
    env.update(extra)
    return env


def launch(*args, env=None, config=None, model=True):
    argv = [BIN, "launch", "--plan"]
    if model:
        argv += ["-m", MODEL]
    if config is not None:
        path = os.path.join(TMP, "launch_config.json")
        with open(path, "w") as f:
            f.write(config if isinstance(config, str) else json.dumps(config))
        argv += ["--config", path]
    argv += list(args)
    return subprocess.run(argv, capture_output=True, text=True, env=env or clean_env(), timeout=60)


def plan(*args, **kw):
    r = launch(*args, **kw)
    assert r.returncode == 0, r.stderr + r.stdout
    lines = {}
    switches = {}
    for line in r.stdout.splitlines():
        m = re.match(r"  (\w[\w ]*?)\s{2,}(.*)$", line)
        if m:
            lines[m.group(1)] = m.group(2)
        m = re.match(r"\s+(\S+)=(\S+) \(set by (\w+)\)$", line)
        if m:
            switches[m.group(1)] = (m.group(2), m.group(3))
    return r.stdout, lines, switches


def gguf_facts():
    from gguf import GGUFReader
    r = GGUFReader(MODEL)
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()

    def num(key):
        return int(r.fields[f"{arch}.{key}"].parts[-1][0])

    n_head = num("attention.head_count")
    kl = f"{arch}.attention.key_length"
    head_dim = int(r.fields[kl].parts[-1][0]) if kl in r.fields else num("embedding_length") // n_head
    return {
        "weights": sum(int(t.n_bytes) for t in r.tensors),
        "n_layer": num("block_count"),
        "n_head_kv": num("attention.head_count_kv"),
        "head_dim": head_dim,
        "n_ctx_train": num("context_length"),
    }


def meminfo_available():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return None


def test_plan_numbers():
    need_model()
    g = gguf_facts()
    out, lines, switches = plan()
    print(out)
    # weights: every tensor's bytes, as the gguf package counts them
    m = re.search(r"\((\d+) bytes\)", lines["weights"])
    assert int(m.group(1)) == g["weights"], (lines["weights"], g["weights"])
    # KV: K and V rows of n_head_kv*head_dim f16 values per layer and token
    per_tok = 2 * g["n_layer"] * g["n_head_kv"] * g["head_dim"] * 2
    m = re.match(r"f16, (\d+) bytes per token of context, x (\d+) context x 1 slot = [\d.]+ GiB \((\d+) bytes\)",
                 lines["KV cache"])
    assert m, lines["KV cache"]
    assert int(m.group(1)) == per_tok
    ctx = int(m.group(2))
    assert int(m.group(3)) == per_tok * ctx
    # with this small model the plan takes the target context: min(trained, 8192)
    assert ctx == min(g["n_ctx_train"], 8192), ctx
    assert lines["context"].startswith(f"{ctx} (planned")
    # memory: MemAvailable as /proc/meminfo says (it moves a little between the two reads)
    avail = meminfo_available()
    m = re.search(r"RAM available ([\d.]+) GiB", lines["memory"])
    assert abs(float(m.group(1)) * 2**30 - avail) < 0.1 * avail, (lines["memory"], avail)
    assert lines["memory"].endswith("FITS")
    assert lines["device"].startswith("CPU") or lines["device"].startswith("GPU")
    assert switches.get("--model", (None, None))[1] == "flag"
    assert f"--ctx {ctx} --kv f16" in lines["command"]
    print(f"checked: weights {g['weights']} bytes, KV {per_tok} bytes/token, context {ctx}, RAM {avail} bytes")


def test_plan_mtp_counts_the_block():
    """--draft mtp: the plan's KV per token grows by the block's attention layer (K and V rows of
    head_count_kv x key_length f16 values), as the engine's memory plan counts it; a file without the
    block plans as before (serve refuses it)."""
    from gguf import GGUFReader
    path = os.path.join(TMP, f"launch_mtp_{os.getpid()}.gguf")
    subprocess.run([BIN, "synth", "--arch", "qwen35moe", "--preset", "tiny", "--mtp", "--quiet", "-o", path],
                   check=True, timeout=60)
    try:
        r = GGUFReader(path)
        n_kv = int(r.fields["qwen35moe.attention.head_count_kv"].parts[-1][0])
        kl = int(r.fields["qwen35moe.attention.key_length"].parts[-1][0])
        per = {}
        for d in ([], ["--draft", "mtp"]):
            _, lines, _ = plan("-m", path, "--ctx", "1024", *d, model=False)
            m = re.match(r"f16, (\d+) bytes per token", lines["KV cache"])
            assert m, lines["KV cache"]
            per[bool(d)] = int(m.group(1))
        assert per[True] - per[False] == 2 * n_kv * kl * 2, (per, n_kv, kl)
        print(f"checked: KV per token {per[False]} -> {per[True]} bytes with --draft mtp")
    finally:
        os.unlink(path)


def test_plan_user_values_kept():
    """--ctx and --kv given: the plan keeps them and says so."""
    need_model()
    g = gguf_facts()
    out, lines, switches = plan("--ctx", "1000", "--kv", "int8", "--slots", "3")
    per_tok = 2 * g["n_layer"] * (g["n_head_kv"] * g["head_dim"] + g["n_head_kv"] * 4)
    assert lines["KV cache"].startswith(f"int8, {per_tok} bytes per token of context, x 1000 context x 3 slots")
    assert lines["context"] == "1000 (flag)"
    assert lines["kv type"] == "int8 (flag)"
    assert switches["--ctx"] == ("1000", "flag") and switches["--slots"] == ("3", "flag")
    print("checked: user --ctx/--kv/--slots kept in the plan and the command:", lines["command"])


def isa_of(lines):
    return re.search(r"(\w+) kernels", lines["device"]).group(1)


def test_precedence():
    need_model()
    hw = isa_of(plan()[1])  # no switch: the CPU's own ISA
    cfg = {"STRATA_ISA": "scalar", "ctx": 1024, "--slots": 2}

    # config beats default
    out, lines, sw = plan(config=cfg)
    assert sw["STRATA_ISA"] == ("scalar", "config") and isa_of(lines) == "scalar", out
    assert sw["--ctx"] == ("1024", "config") and lines["context"] == "1024 (config)", out
    assert sw["--slots"] == ("2", "config")

    # env beats config: the value in effect and the source
    out, lines, sw = plan(config=cfg, env=clean_env(STRATA_ISA="avx2"))
    assert sw["STRATA_ISA"] == ("avx2", "env"), out
    expect = ISAS[min(ISAS.index(hw), ISAS.index("avx2"))]
    assert isa_of(lines) == expect, (lines["device"], expect)
    assert "note: config's STRATA_ISA=scalar is not used: STRATA_ISA was set by env" in out

    # flag beats config
    out, lines, sw = plan("--ctx", "2048", config=cfg)
    assert sw["--ctx"] == ("2048", "flag") and lines["context"] == "2048 (flag)", out
    assert "note: config's --ctx=1024 is not used: --ctx was set by flag" in out
    assert "--ctx 2048" in lines["command"]

    # flag beats env (the API key: env STRATA_API_KEY vs --api-key), and a secret is never printed
    out, lines, sw = plan("--api-key", "sekrit-flag", env=clean_env(STRATA_API_KEY="sekrit-env"))
    assert sw["--api-key"] == ("***", "flag") and "sekrit" not in out, out
    assert "--api-key ***" in lines["command"]

    # nobody set anything: defaults, nothing listed
    out, lines, sw = plan()
    assert "STRATA_ISA" not in sw and "--ctx" not in sw and lines["context"].endswith("that fits)"), out
    print(f"checked: config>default, env>config (ISA {expect}), flag>config, flag>env; CPU ISA {hw}")


@pytest.mark.parametrize("text,needle", [
    (None, "No such file"),
    ('{"ctx": 1024,', "line 1"),
    ('[1, 2]', "one JSON object"),
    ('{"ctx": 1024, "ctx": 2048}', "duplicate"),
    ('{"no_such_switch": 1}', "unknown key 'no_such_switch'"),
    ('{"ctx": "many"}', "invalid value 'many' for --ctx"),
    ('{"kv": "f32"}', "invalid value 'f32' for --kv"),
    ('{"port": 70000}', "invalid value '70000' for --port"),
    ('{"STRATA_ISA": [1]}', "must be a string, a whole number or a boolean"),
])
def test_bad_config(text, needle):
    need_model()
    if text is None:
        path = os.path.join(TMP, "no_such_config.json")
        r = subprocess.run([BIN, "launch", "--plan", "--config", path], capture_output=True, text=True,
                           env=clean_env(), timeout=60)
    else:
        r = launch(config=text)
        path = os.path.join(TMP, "launch_config.json")
    print(f"config {text!r}: rc {r.returncode}: {r.stderr.strip()}")
    assert r.returncode == 2
    assert f"config {path}" in r.stderr and needle in r.stderr, r.stderr
    assert "strata launch plan" not in r.stdout  # nothing planned on a bad config


def test_bad_flag():
    r = launch("--ctx", "zero", model=False)
    assert r.returncode == 2 and "invalid value 'zero' for --ctx" in r.stderr, r.stderr
    r = launch("--bogus", model=False)
    assert r.returncode == 2 and "--bogus" in r.stderr, r.stderr
    print("checked: bad flags exit 2 with the flag named")


def split_facts():
    """Per layer (and for the embedding and output matrices) the bytes of the
    file's matrices (the plan's rank weights count no 1-D norm vectors)."""
    from gguf import GGUFReader
    r = GGUFReader(MODEL)
    per_layer, ends = {}, 0
    for t in r.tensors:
        if len([d for d in t.shape if d > 1]) < 2:
            continue
        m = re.match(r"blk\.(\d+)\.", t.name)
        if m:
            per_layer[int(m.group(1))] = per_layer.get(int(m.group(1)), 0) + int(t.n_bytes)
        elif t.name in ("token_embd.weight", "output.weight"):
            ends += int(t.n_bytes)
    return per_layer, ends


def test_plan_split():
    """--devices cpu,cpu,cpu --layer-split 3,20,7: each rank's layers, weights
    (the file's matrices of its layers, rank 0 the embedding and output too)
    and KV (its layers' K and V rows at the planned context), and the serve
    command carries the split."""
    need_model()
    g = gguf_facts()
    per_layer, ends = split_facts()
    out, lines, switches = plan("--devices", "cpu,cpu,cpu", "--layer-split", "3,20,7", "--pipeline-windows", "4")
    print(out)
    ctx = int(lines["context"].split()[0])
    assert lines["split"].startswith("3 ranks in this process (--devices cpu,cpu,cpu, flag), layers 3,20,7 (flag)")
    ranks = re.findall(r"rank (\d)  cpu\s+layers (\d+)\.\.(\d+)(?: \(embedding, output head\))?: "
                       r"weights ([\d.]+) GiB, KV ([\d.]+) GiB", out)
    assert [(int(a), int(b)) for _, a, b, _, _ in ranks] == [(0, 2), (3, 22), (23, 29)], ranks
    kv_layer_tok = 2 * g["n_head_kv"] * g["head_dim"] * 2
    for r, a, b, w, kv in ranks:
        want_w = sum(per_layer[il] for il in range(int(a), int(b) + 1)) + (ends if r == "0" else 0)
        want_kv = kv_layer_tok * (int(b) - int(a) + 1) * ctx
        assert abs(float(w) * 2**30 - want_w) <= 0.0005 * 2**30, (r, w, want_w)
        assert abs(float(kv) * 2**30 - want_kv) <= 0.0005 * 2**30, (r, kv, want_kv)
    assert "one each for 3 ranks" in lines["scratch"], lines["scratch"]
    assert "pipelined windows: 4 per prompt chunk (flag)" in out
    assert "--devices cpu,cpu,cpu --layer-split 3,20,7 --pipeline-windows 4" in lines["command"], lines["command"]
    assert switches["--devices"] == ("cpu,cpu,cpu", "flag")
    print(f"checked: 3 ranks' layers, weights and KV at context {ctx} against the file; the command carries them")


@pytest.mark.parametrize("args,needle", [
    (("--devices", "cpu,0"), "plans CPU ranks only so far"),
    (("--devices", "cpu,cpu", "--layer-split", "3,3"), "--layer-split 3,3: 2 counts summing to 6"),
    (("--devices", "cpu,gpu"), "--devices cpu,gpu: want a comma-separated list"),
])
def test_plan_split_refused(args, needle):
    """What the engine would refuse, the plan refuses first (exit 2, nothing planned)."""
    need_model()
    r = launch(*args)
    assert r.returncode == 2 and needle in r.stderr, (r.returncode, r.stderr)
    assert "strata launch plan" not in r.stdout
    print(f"checked: {' '.join(args)} -> exit 2: {r.stderr.strip()[:120]}")


def serve_launch(config, env):
    """strata launch (no --plan) with this config: (process, stderr lines, port)."""
    path = os.path.join(TMP, "launch_serve.json")
    with open(path, "w") as f:
        json.dump(config, f)
    p = subprocess.Popen([BIN, "launch", "-m", MODEL, "--config", path], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    lines, port, ready = [], [None], threading.Event()

    def drain():
        for line in p.stderr:
            lines.append(line.rstrip("\n"))
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if m:
                port[0] = int(m.group(1))
                ready.set()
        ready.set()

    threading.Thread(target=drain, daemon=True).start()
    if not (ready.wait(60) and port[0]):
        p.kill()
        raise AssertionError("launch did not start:\n" + "\n".join(lines))
    return p, lines, port[0]


def stop_launch(p, lines):
    p.terminate()
    try:
        p.wait(20)
    except subprocess.TimeoutExpired:
        p.kill()
    assert p.returncode == 0, "\n".join(lines)


def test_launch_serves_with_config():
    """Without --plan: serves; the start log names each non-default and who
    set it; a config switch reaches the engine (STRATA_PRECISE logs there)."""
    need_model()
    p, lines, port = serve_launch({"port": 0, "ctx": 512, "STRATA_PRECISE": True, "STRATA_ISA": "scalar"},
                                  clean_env(STRATA_ISA="avx2"))
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10) as r:
            models = json.load(r)
        assert models["data"][0]["context_length"] == 512, models
        # the engine may run in a child process: give its start lines a moment
        t0 = time.time()
        while time.time() - t0 < 10 and not any("STRATA_PRECISE=1" in l and "f32" in l for l in lines):
            time.sleep(0.1)
        log = "\n".join(lines)
        print(log)
        assert "launch: switch STRATA_PRECISE=1 (set by config)" in log
        assert "launch: switch STRATA_ISA=avx2 (set by env)" in log
        assert "launch: switch --ctx=512 (set by config)" in log
        assert any("STRATA_PRECISE=1" in l and "f32 activations" in l for l in lines), log
    finally:
        stop_launch(p, lines)
    print("checked: launch served context 512 from the config; start log names config/env switches; "
          "STRATA_PRECISE from the config reached the engine")


def test_launch_serves_a_split():
    """--devices from the config: the engine runs two in-process ranks and
    answers; greedy text equal to the unsplit plan's server."""
    need_model()
    body = json.dumps({"prompt": "The capital of France is", "max_tokens": 12, "temperature": 0}).encode()
    texts = {}
    for name, extra in (("split", {"devices": "cpu,cpu"}), ("whole", {})):
        p, lines, port = serve_launch({"port": 0, "ctx": 512, **extra}, clean_env())
        try:
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=60) as r:
                texts[name] = json.load(r)["choices"][0]["text"]
        finally:
            stop_launch(p, lines)
        log = "\n".join(lines)
        if name == "split":
            assert "launch: switch --devices=cpu,cpu (set by config)" in log, log
            assert re.search(r"rank 0 of 2 \(in-process\): layers 0\.\.\d+ of 30", log), log
    assert texts["split"] == texts["whole"] and texts["split"], texts
    print(f"checked: launch with devices cpu,cpu in the config served two in-process ranks; greedy text "
          f"{texts['split']!r} equal to the unsplit server's")
