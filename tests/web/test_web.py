"""The web page at GET /, driven in headless Chromium by playwright.

A real `strata serve` with the real default model on a free port; Debian's
chromium (playwright's own browser download is not used: executable_path,
STRATA_CHROMIUM or /usr/bin/chromium). The test types a message, waits for the
answer to stream in (the text must be seen growing, not only appear whole),
and checks the monitor against the server's own /metrics and /metrics/gpu:
slots, context, generated tokens, speed, and the GPU cards or "no GPU". A
screenshot is kept in $STRATA_ARTIFACTS (the build's artifacts/) as web.png.
The page must load under its Content-Security-Policy with no console errors
(and the CSP is real: the test's own waits are arrow functions, because a
string to evaluate is refused by the page's script-src 'self').
"""
import os
import re
import sys
import time

import pytest

# the one way to start a server, shared with tests/server
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "server"))
from strata_server import CTX, ROOT, Server  # noqa: E402

CHROMIUM = os.environ.get("STRATA_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = os.environ.get("STRATA_ARTIFACTS", os.path.join(ROOT, "build", "artifacts"))


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("SKIPPED: the playwright package is missing (scripts/install-deps.sh installs it)")
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"SKIPPED: {CHROMIUM} is missing (apt-get install chromium; or set STRATA_CHROMIUM)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


def open_page(browser, url):
    page = browser.new_page(viewport={"width": 1200, "height": 760})
    problems = []
    page.on("console", lambda m: m.type == "error" and problems.append("console: " + m.text))
    page.on("pageerror", lambda e: problems.append("page error: " + str(e)))
    page.goto(url)
    return page, problems


def test_page_headers_and_assets():
    s = Server()
    try:
        status, h, html = s.get("/")
        assert status == 200 and h["Content-Type"].startswith("text/html"), (status, h)
        csp = h["Content-Security-Policy"]
        assert "default-src 'none'" in csp and "script-src 'self'" in csp and "connect-src 'self'" in csp, csp
        # everything the page refers to is on this server, and is served
        refs = re.findall(r'(?:src|href)="([^"]+)"', html)
        assert refs, html
        for ref in refs:
            if ref.startswith("data:"):
                continue
            assert ref.startswith("/"), f"the page refers to {ref} outside this server"
            st, hh, _ = s.get(ref)
            assert st == 200 and "Content-Security-Policy" in hh, (ref, st)
        assert "<script>" not in html and "style=" not in html  # nothing inline for the CSP to refuse
        st, _, gpu = s.get("/metrics/gpu")
        assert st == 200 and re.search(r"^strata_gpu_count \d+$", gpu, re.M), gpu
        print(f"checked: / and {len(refs)} assets served with CSP '{csp}'; /metrics/gpu: "
              f"{re.search(r'^strata_gpu_count .*$', gpu, re.M).group(0)}")
    finally:
        assert s.stop() == 0


@pytest.fixture(scope="module")
def server():
    s = Server()
    yield s
    assert s.stop() == 0, "\n".join(s.lines[-30:])


def test_chat_streams_and_monitor(browser, server):
    s = server
    page, problems = open_page(browser, s.url + "/")
    page.wait_for_function("() => document.getElementById('status').textContent === 'ready'", timeout=20000)
    # the monitor against the server's own numbers
    m = s.metrics()
    page.wait_for_function("() => document.getElementById('m_ctx').textContent !== '–'", timeout=5000)
    assert page.inner_text("#m_ctx") == str(CTX) == str(int(m["strata_context_tokens"]))
    assert page.inner_text("#m_slots") == f"0 of {int(m['strata_slots_total'])}"
    assert page.inner_text("#m_queue") == "0"
    assert "SmolLM2" in page.inner_text("#model")

    # greedy, and a prompt whose answer is long (SmolLM2: 100+ tokens, a second or more):
    # "Name three colours of the rainbow." at 0.7 once answered in 18 tokens, which
    # reached the page in one read (CI, 2026-12-03: lengths [0, 89]) while the machine
    # was busy; a stream of a second cannot arrive whole without a stall that long
    page.eval_on_selector("#temperature", "e => { e.value = '0'; }")  # in the folded settings
    page.fill("#input", "Write a short story about a lighthouse keeper and a lost ship.")
    # every change of the answer's text, recorded in the page as it happens (polling from
    # here can miss the steps of a short answer: 20 tokens stream in 0.2 s)
    page.evaluate('''() => {
        window.__lengths = [];
        new MutationObserver(() => {
            const t = [...document.querySelectorAll('.msg.assistant .text')].map(e => e.textContent).join('');
            const a = window.__lengths;
            if (!a.length || a[a.length - 1] !== t.length) a.push(t.length);
        }).observe(document.getElementById('log'), {subtree: true, childList: true, characterData: true});
    }''')
    page.press("#input", "Enter")
    # the answer must grow in steps while it streams
    lengths, t0 = [], time.time()
    while time.time() - t0 < 90:
        txt = page.eval_on_selector_all(".msg.assistant .text", "els => els.map(e => e.textContent).join('')")
        if not lengths or len(txt) != lengths[-1]:
            lengths.append(len(txt))
        if page.query_selector(".msg.assistant .stats, .msg.error"):
            break
        time.sleep(0.03)
    assert not page.query_selector(".msg.error"), page.inner_text(".msg.error")
    answer = page.inner_text(".msg.assistant .text")
    stats = page.inner_text(".msg.assistant .stats")
    seen = page.evaluate("() => window.__lengths")
    print(f"answer ({stats}): {answer!r}; text lengths seen while streaming: {seen[:12]}...")
    assert answer.strip(), "empty answer"
    growing = [n for n in seen if 0 < n < len(answer)]
    assert len(growing) >= 2, f"the answer did not stream in steps: {seen} (polled: {lengths})"
    n_tok = int(re.match(r"(\d+) tokens", stats).group(1))

    # the server counted that generation; the monitor shows the server's numbers
    m = s.metrics()
    assert m["strata_generated_tokens_total"] == n_tok, (m["strata_generated_tokens_total"], n_tok)
    page.wait_for_function(f"() => document.getElementById('m_tokens').textContent === '{n_tok}'", timeout=5000)
    gen = float(page.inner_text("#m_gen"))
    assert gen > 0 and abs(gen - m["strata_generation_tokens_per_second"]) < 0.06, gen
    assert float(page.inner_text("#m_prompt")) > 0

    # GPUs: one card per GPU NVML reports, or "no GPU"
    g = s.metrics("/metrics/gpu")
    n_gpu = int(g["strata_gpu_count"])
    if n_gpu == 0:
        assert page.inner_text("#gpus") == "no GPU"
    else:
        page.wait_for_function(f"() => document.querySelectorAll('#gpus .gpu').length === {n_gpu}", timeout=5000)
        card = page.inner_text("#gpus .gpu")
        assert re.search(r"load\s+\d+%", card) and re.search(r"VRAM\s+[\d.]+ / [\d.]+ GiB", card), card
        assert re.search(r"temperature\s+\d+ °C", card) and re.search(r"power\s+\d+ W", card), card

    os.makedirs(ARTIFACTS, exist_ok=True)
    shot = os.path.join(ARTIFACTS, "web.png")
    page.screenshot(path=shot)
    assert not problems, problems
    print(f"checked: streamed answer of {n_tok} tokens; monitor: gen {gen} tok/s, context {CTX}, "
          f"{n_gpu} GPU(s); screenshot {shot}")


# Two cards as NVML would report them through /metrics/gpu (made-up readings in
# the shape srv_web.c writes), for the page's rendering of GPUs on a machine
# that has none.
GPU_TEXT = """# HELP strata_gpu_count GPUs NVML reports.
# TYPE strata_gpu_count gauge
strata_gpu_count 2
strata_gpu_info{gpu="0",name="NVIDIA H200"} 1
strata_gpu_utilization_percent{gpu="0"} 37
strata_gpu_memory_used_bytes{gpu="0"} 22011707392
strata_gpu_memory_total_bytes{gpu="0"} 150754820096
strata_gpu_temperature_celsius{gpu="0"} 41
strata_gpu_power_watts{gpu="0"} 212.7
strata_gpu_power_limit_watts{gpu="0"} 700
strata_gpu_info{gpu="1",name="NVIDIA \\"quoted\\" card"} 1
strata_gpu_utilization_percent{gpu="1"} 100
strata_gpu_memory_used_bytes{gpu="1"} 1073741824
strata_gpu_memory_total_bytes{gpu="1"} 25769803776
strata_gpu_temperature_celsius{gpu="1"} 80
strata_gpu_power_watts{gpu="1"} 349
strata_gpu_power_limit_watts{gpu="1"} 350
"""


def test_gpu_cards(browser, server):
    page, problems = open_page(browser, "about:blank")
    page.route("**/metrics/gpu", lambda route: route.fulfill(status=200, content_type="text/plain", body=GPU_TEXT))
    page.goto(server.url + "/")
    page.wait_for_function("() => document.querySelectorAll('#gpus .gpu').length === 2", timeout=10000)
    cards = page.eval_on_selector_all("#gpus .gpu", "els => els.map(e => e.innerText)")  # one read of all
    print("cards:", cards)
    expect = [("NVIDIA H200", 37, 22011707392, 150754820096, 41, 212.7, 700),
              ('NVIDIA "quoted" card', 100, 1073741824, 25769803776, 80, 349, 350)]
    for i, (card, (name, util, used, total, temp, watts, limit)) in enumerate(zip(cards, expect)):
        assert card.startswith(f"GPU {i}: {name}"), card
        assert re.search(rf"load\s+{util}%", card), card
        assert re.search(rf"VRAM\s+{used / 2**30:.1f} / {total / 2**30:.1f} GiB", card), card
        assert re.search(rf"temperature\s+{temp} °C", card), card
        assert re.search(rf"power\s+{watts:.0f} W / {limit} W", card), card
    bars = page.eval_on_selector_all("#gpus .gpu:first-child .bar > span", "els => els.map(e => e.style.width)")
    assert bars == ["37%", f"{100 * 22011707392 / 150754820096:.0f}%"], bars
    os.makedirs(ARTIFACTS, exist_ok=True)
    page.screenshot(path=os.path.join(ARTIFACTS, "web_gpus.png"))
    assert not problems, problems
    print("checked: two GPU cards with name, load, VRAM, temperature, power and load/VRAM bars")


def test_api_key_page(browser):
    """With --api-key the page itself loads (it holds no secret), the monitor
    asks for the key, and works once it is typed in Settings."""
    s = Server("--api-key", "k-123")
    try:
        assert s.get("/")[0] == 200 and s.get("/metrics")[0] == 401
        page, problems = open_page(browser, s.url + "/")
        page.wait_for_function("() => document.getElementById('status').textContent.startsWith('API key')", timeout=10000)
        page.click("#settings summary")
        page.fill("#api_key", "k-123")
        page.wait_for_function("() => document.getElementById('status').textContent === 'ready'", timeout=10000)
        assert page.inner_text("#m_ctx") == str(CTX)
        problems = [p for p in problems if "401" not in p]  # the refused polls before the key was typed
        assert not problems, problems
        print("checked: page served without the key; monitor 401 -> 'API key needed' -> ready with the key")
    finally:
        assert s.stop() == 0


def test_expert_cache_heatmap(browser, tmp_path):
    """A MoE model with part of its experts cached (on this CPU-only build a
    second CPU backend plays the GPU, docs/offload.md): the monitor draws the
    cache as a layer x expert picture from GET /experts, a pixel per cell in
    the colours of the legend, and plots speed and hit rate over time."""
    import subprocess
    from strata_server import BIN
    layers, experts = 3, 16
    path = tmp_path / "moe.gguf"
    r = subprocess.run([BIN, "synth", "--preset", "tiny", "--zipf", "1.0", "--layers", str(layers), "--experts",
                        str(experts), "--experts-used", "2", "-o", str(path), "--quiet"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    s = Server("-m", str(path), "--expert-cache", "12", "-t", "2")
    try:
        page, problems = open_page(browser, s.url + "/")
        page.wait_for_function("() => document.getElementById('status').textContent === 'ready'", timeout=20000)
        assert page.is_hidden("#experts_box")  # nothing to draw before a request has finished
        st, _, _ = s.get("/experts")
        assert st == 200
        import json
        import urllib.request
        req = urllib.request.Request(s.url + "/v1/completions", method="POST",
                                     data=json.dumps({"prompt": "the cache", "max_tokens": 8}).encode(),
                                     headers={"Content-Type": "application/json"})
        assert urllib.request.urlopen(req, timeout=60).status == 200
        page.wait_for_function("() => !document.getElementById('experts_box').hidden", timeout=10000)
        j = json.loads(s.get("/experts")[2])
        assert j["offloaded"] and j["layers"] == layers and j["experts"] == experts and j["resident"] == 12, j
        page.wait_for_function("() => document.getElementById('experts').dataset.resident === '12'", timeout=5000)
        w, h, rgb = page.evaluate("""() => {
            const cv = document.getElementById('experts'), d = cv.getContext('2d').getImageData(0, 0, cv.width, cv.height).data;
            const px = [];
            for (let i = 0; i < d.length; i += 4) px.push([d[i], d[i + 1], d[i + 2]]);
            return [cv.width, cv.height, px];
        }""")
        assert (w, h) == (experts, layers), (w, h)
        on_gpu = sum(1 for p in rgb if p[2] > p[0])  # the GPU's cells are the blue ones
        assert on_gpu == 12, rgb
        # a cell's colour follows its code: blue = cached, then heat; the same split as /experts
        cells = j["cells"]
        assert all((c >= "4") == (p[2] > p[0]) for c, p in zip(cells, rgb)), (cells, rgb)
        note = page.inner_text("#experts_note")
        assert f"{layers} layers × {experts} experts; 12 cached on the GPU" in note, note
        page.wait_for_function("() => +document.getElementById('history').dataset.points >= 3", timeout=10000)
        assert page.is_visible("#hist_hits")  # the hit rate is plotted beside the speed
        os.makedirs(ARTIFACTS, exist_ok=True)
        page.screenshot(path=os.path.join(ARTIFACTS, "web_experts.png"))
        assert not problems, problems
        print(f"checked: /experts {layers} x {experts}, heatmap pixels match the cells (12 blue), history plotted")
    finally:
        assert s.stop() == 0


def test_reasoning_shown_apart(browser, tmp_path):
    """A thinking model's reasoning (delta.reasoning_content) goes into its own open 'Reasoning' box, not into
    the answer: a copy of the default model whose template opens <think> in the prompt, so all it writes is
    reasoning (tests/server/test_reasoning.py checks the split itself)."""
    from test_reasoning import TEMPLATES, model_with_template
    with open(os.path.join(TEMPLATES, "smollm2.jinja")) as f:
        t = f.read().rstrip("\n").replace("{{ '<|im_start|>assistant\n' }}", "{{ '<|im_start|>assistant\n<think>\n' }}")
    assert "<think>" in t
    s = Server("-m", model_with_template(str(tmp_path), "think", t))
    try:
        page, problems = open_page(browser, s.url + "/")
        page.wait_for_function("() => document.getElementById('status').textContent === 'ready'", timeout=20000)
        page.fill("#input", "Hi")
        page.press("#input", "Enter")
        page.wait_for_selector(".msg.assistant .stats, .msg.error", timeout=90000)
        assert not page.query_selector(".msg.error"), page.inner_text(".msg.error")
        box = page.inner_text(".msg.assistant details.thinking div")
        answer = page.inner_text(".msg.assistant .text")
        assert box.strip() and answer == "" and page.get_attribute(".msg.assistant details.thinking", "open") is not None
        assert not problems, problems
        print(f"checked: the page shows the reasoning apart ({box[:50]!r}...), the answer empty")
    finally:
        assert s.stop() == 0
