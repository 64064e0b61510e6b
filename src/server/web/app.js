// Strata's page: a chat that streams from POST /v1/chat/completions
// (fetch + ReadableStream, server-sent events), and a monitor that polls
// /metrics and /metrics/gpu once a second. Text from the model or the server
// is only ever set with textContent, never parsed as HTML.
"use strict";

const $ = (id) => document.getElementById(id);
const conversation = [];          // {role, content} of this conversation
let modelName = null;
let controller = null;       // AbortController of the answer in flight

function headers(json) {
  const h = {};
  if (json) h["Content-Type"] = "application/json";
  const key = $("api_key").value.trim();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

// ---- chat ----

function addMessage(role, text) {
  $("hint").hidden = true;
  const div = document.createElement("div");
  div.className = "msg " + role;
  const span = document.createElement("span");
  span.className = "text";
  span.textContent = text;
  div.appendChild(span);
  $("log").appendChild(div);
  div.scrollIntoView({ block: "end" });
  return div;
}

function setStats(div, text) {
  const s = document.createElement("span");
  s.className = "stats";
  s.textContent = text;
  div.appendChild(s);
}

async function errorText(resp) {
  try {
    const j = await resp.json();
    return (j.error && j.error.message) || JSON.stringify(j);
  } catch (e) {
    return resp.status + " " + resp.statusText;
  }
}

async function send(text) {
  addMessage("user", text);
  conversation.push({ role: "user", content: text });
  const msgs = [];
  const sys = $("system").value.trim();
  if (sys) msgs.push({ role: "system", content: sys });
  msgs.push(...conversation);
  const body = {
    messages: msgs, stream: true, stream_options: { include_usage: true },
    max_tokens: Math.max(1, parseInt($("max_tokens").value, 10) || 256),
    temperature: Math.min(2, Math.max(0, parseFloat($("temperature").value) || 0)),
  };
  if (modelName) body.model = modelName;
  const div = addMessage("assistant streaming", "");
  const out = div.querySelector(".text");
  controller = new AbortController();
  $("send").disabled = true;
  $("stop").disabled = false;
  const t0 = performance.now();
  let tFirst = 0, chunks = 0, usage = null, finish = null, answer = "", reasoning = "";
  try {
    const resp = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers(true), body: JSON.stringify(body), signal: controller.signal,
    });
    if (!resp.ok) throw new Error(await errorText(resp));
    const reader = resp.body.getReader();
    const dec = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {   // one server-sent event per blank line
        const event = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        for (const line of event.split("\n")) {
          if (!line.startsWith("data:")) continue;
          const data = line.slice(5).trim();
          if (data === "[DONE]") continue;
          const j = JSON.parse(data);
          if (j.error) throw new Error(j.error.message || "the server reported an error");
          if (j.usage) usage = j.usage;
          const c = j.choices && j.choices[0];
          if (!c) continue;
          if (c.finish_reason) finish = c.finish_reason;
          const thought = c.delta && c.delta.reasoning_content;   // a thinking model's reasoning, shown apart
          if (thought) {
            if (!tFirst) tFirst = performance.now();
            reasoning += thought;
            let box = div.querySelector(".thinking");
            if (!box) {
              box = document.createElement("details");
              box.className = "thinking";
              box.open = true;
              const sum = document.createElement("summary");
              sum.textContent = "Reasoning";
              box.appendChild(sum);
              box.appendChild(document.createElement("div"));
              div.insertBefore(box, out);
            }
            box.querySelector("div").textContent = reasoning;
            div.scrollIntoView({ block: "end" });
          }
          const piece = c.delta && c.delta.content;
          if (piece) {
            if (!tFirst) tFirst = performance.now();
            chunks++;
            answer += piece;
            out.textContent = answer;
            div.scrollIntoView({ block: "end" });
          }
        }
      }
    }
    conversation.push({ role: "assistant", content: answer });
    const secs = (performance.now() - (tFirst || t0)) / 1000;
    const n = usage ? usage.completion_tokens : chunks;
    let s = `${n} tokens`;
    if (secs > 0 && n > 1) s += `, ${(n / secs).toFixed(1)} tok/s`;
    if (tFirst) s += `, first token after ${((tFirst - t0) / 1000).toFixed(2)} s`;
    if (usage) s += `, prompt ${usage.prompt_tokens} tokens`;
    if (finish) s += ` (${finish})`;
    setStats(div, s);
  } catch (e) {
    if (e.name === "AbortError") {
      conversation.push({ role: "assistant", content: answer });
      setStats(div, "stopped");
    } else {
      div.className = "msg error";
      out.textContent = (answer ? answer + "\n\n" : "") + "Error: " + e.message;
      conversation.pop();   // the question was not answered: do not send it again as conversation
    }
  } finally {
    div.classList.remove("streaming");
    controller = null;
    $("send").disabled = false;
    $("stop").disabled = true;
    $("input").focus();
  }
}

$("form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const text = $("input").value.trim();
  if (!text || controller) return;
  $("input").value = "";
  send(text);
});
$("input").addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && !ev.shiftKey) {
    ev.preventDefault();
    $("form").requestSubmit();
  }
});
$("stop").addEventListener("click", () => controller && controller.abort());
$("clear").addEventListener("click", () => {
  if (controller) controller.abort();
  conversation.length = 0;
  for (const m of [...document.querySelectorAll(".msg")]) m.remove();
  $("hint").hidden = false;
});

// ---- monitor ----

// Prometheus text -> [{name, labels: {k: v}, value}]
function parseMetrics(text) {
  const out = [];
  for (const line of text.split("\n")) {
    if (!line || line[0] === "#") continue;
    const m = /^([a-zA-Z_:][\w:]*)(\{(.*)\})?\s+(\S+)$/.exec(line);
    if (!m) continue;
    const labels = {};
    if (m[3]) for (const l of m[3].matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]] = l[2].replace(/\\(.)/g, "$1");
    out.push({ name: m[1], labels, value: parseFloat(m[4]) });
  }
  return out;
}

const val = (ms, name, pred) => {
  const m = ms.find((x) => x.name === name && (!pred || pred(x.labels)));
  return m ? m.value : undefined;
};
const fmt = (v, d = 1) => (v === undefined || isNaN(v) ? "–" : v.toFixed(d));
const gib = (b) => (b / 1073741824).toFixed(1);

function setStatus(text, cls) {
  $("status").textContent = text;
  $("status").className = "pill " + cls;
}

function showServer(ms) {
  $("m_gen").textContent = fmt(val(ms, "strata_generation_tokens_per_second"));
  $("m_prompt").textContent = fmt(val(ms, "strata_prompt_tokens_per_second"));
  const busy = val(ms, "strata_slots_busy"), total = val(ms, "strata_slots_total");
  $("m_slots").textContent = busy === undefined ? "–" : `${busy} of ${total}`;
  $("m_queue").textContent = fmt(val(ms, "strata_queue_depth"), 0);
  $("m_ctx").textContent = fmt(val(ms, "strata_context_tokens"), 0);
  const reused = val(ms, "strata_prompt_tokens_reused_total"), prompt = val(ms, "strata_prompt_tokens_total");
  $("m_reuse").textContent = prompt ? `${((100 * reused) / prompt).toFixed(0)}%` : "–";
  // the expert cache's hit rate, where the engine reports one (MoE models on a GPU)
  const hit = ms.find((x) => /expert_cache_hit/.test(x.name) && !/_total$/.test(x.name));
  $("m_hit").hidden = $("m_hit_t").hidden = !hit;
  if (hit) $("m_hit").textContent = hit.value <= 1 ? `${(100 * hit.value).toFixed(0)}%` : fmt(hit.value);
  $("m_tokens").textContent = fmt(val(ms, "strata_generated_tokens_total"), 0);
  const req = ms.filter((x) => x.name === "strata_http_requests_total").reduce((a, x) => a + x.value, 0);
  $("m_requests").textContent = req.toFixed(0);
}

// One card per GPU, built once and then updated in place, so that the
// numbers change without the cards being rebuilt every second.
const cards = new Map();     // gpu index -> {card, title, dd: {row: element}, bar: {row: element}}
const ROWS = ["load", "VRAM", "temperature", "power"];

function gpuCard(i) {
  const card = document.createElement("div");
  card.className = "gpu";
  const title = document.createElement("div");
  title.className = "name";
  card.appendChild(title);
  const dl = document.createElement("dl");
  const c = { card, title, dd: {}, bar: {} };
  for (const k of ROWS) {
    const dt = document.createElement("dt"), dd = document.createElement("dd");
    dt.textContent = k;
    dl.append(dt, dd);
    c.dd[k] = dd;
    if (k === "load" || k === "VRAM") {
      const bar = document.createElement("div"), fill = document.createElement("span");
      bar.className = "bar";
      bar.appendChild(fill);
      dl.appendChild(bar);
      c.bar[k] = fill;
    }
  }
  card.appendChild(dl);
  cards.set(i, c);
  return c;
}

function showGpus(ms) {
  const box = $("gpus");
  const n = val(ms, "strata_gpu_count");
  const infos = ms.filter((x) => x.name === "strata_gpu_info");
  if (!n || !infos.length) {
    if (!$("no_gpu")) {
      cards.clear();
      const p = document.createElement("p");
      p.className = "muted";
      p.id = "no_gpu";
      p.textContent = "no GPU";
      box.replaceChildren(p);
    }
    return;
  }
  const seen = new Set(infos.map((x) => x.labels.gpu));
  if ($("no_gpu") || [...cards.keys()].some((k) => !seen.has(k)) || cards.size !== seen.size) {
    cards.clear();   // the set of cards changed: build them again
    box.replaceChildren(...infos.map((x) => gpuCard(x.labels.gpu).card));
  }
  for (const info of infos) {
    const i = info.labels.gpu, c = cards.get(i), is = (l) => l.gpu === i;
    const util = val(ms, "strata_gpu_utilization_percent", is);
    const used = val(ms, "strata_gpu_memory_used_bytes", is), total = val(ms, "strata_gpu_memory_total_bytes", is);
    const temp = val(ms, "strata_gpu_temperature_celsius", is), watts = val(ms, "strata_gpu_power_watts", is);
    const limit = val(ms, "strata_gpu_power_limit_watts", is);
    c.title.textContent = `GPU ${i}: ${info.labels.name || "GPU"}`;
    c.dd.load.textContent = util === undefined ? "–" : `${util.toFixed(0)}%`;
    c.dd.VRAM.textContent = used === undefined ? "–" : `${gib(used)} / ${gib(total)} GiB`;
    c.dd.temperature.textContent = temp === undefined ? "–" : `${temp.toFixed(0)} °C`;
    c.dd.power.textContent = watts === undefined ? "–" : `${watts.toFixed(0)} W` + (limit ? ` / ${limit.toFixed(0)} W` : "");
    const pct = (v) => Math.min(100, Math.max(0, v || 0)).toFixed(0) + "%";
    c.bar.load.style.width = pct(util);
    c.bar.VRAM.style.width = pct(total ? (100 * used) / total : 0);
  }
}

// ---- history: generation speed and expert cache hits, one point per poll ----
const history = [];   // {tps, hit}
const HISTORY_N = 240;

function showHistory(ms) {
  const hitM = ms.find((x) => /expert_cache_hit/.test(x.name) && !/_total$/.test(x.name));
  history.push({ tps: val(ms, "strata_generation_tokens_per_second") || 0, hit: hitM ? hitM.value : undefined });
  if (history.length > HISTORY_N) history.shift();
  $("hist_hits").hidden = $("hist_hits_t").hidden = !hitM;
  const cv = $("history"), g = cv.getContext("2d"), W = cv.width, H = cv.height;
  g.clearRect(0, 0, W, H);
  const top = Math.max(1, ...history.map((p) => p.tps));
  const line = (key, scale, colour) => {
    g.strokeStyle = colour;
    g.lineWidth = 1.5;
    g.beginPath();
    let started = false;
    history.forEach((p, i) => {
      if (p[key] === undefined) return;
      const x = W - (history.length - 1 - i) * (W / (HISTORY_N - 1)), y = H - 2 - (p[key] / scale) * (H - 4);
      if (started) g.lineTo(x, y); else g.moveTo(x, y), (started = true);
    });
    g.stroke();
  };
  line("tps", top, "#2a7de1");
  line("hit", 1, "#1b9e5a");
  cv.dataset.points = String(history.length);
}

// ---- the expert cache: a pixel per (layer, expert) ----
// cell code: '0' + heat level 0-3 + 4 when the GPU holds it (GET /experts)
const CELL_RGB = [
  [201, 201, 201], [240, 190, 120], [235, 130, 70], [224, 88, 43],   // in RAM: cold to hot
  [150, 185, 235], [95, 145, 220], [50, 110, 205], [31, 95, 191],    // on the GPU: cold to hot
];

async function showExperts() {
  const r = await fetch("/experts", { headers: headers(false) });
  const j = r.ok ? await r.json() : { offloaded: false };
  $("experts_box").hidden = !j.offloaded;
  if (!j.offloaded) return;
  const cv = $("experts");
  cv.width = j.experts;
  cv.height = j.layers;
  const g = cv.getContext("2d"), img = g.createImageData(j.experts, j.layers);
  for (let i = 0; i < j.cells.length; i++) {
    const rgb = CELL_RGB[j.cells.charCodeAt(i) - 48] || [0, 0, 0];
    img.data.set([rgb[0], rgb[1], rgb[2], 255], 4 * i);
  }
  g.putImageData(img, 0, 0);
  cv.dataset.resident = String(j.resident);
  $("experts_note").textContent =
    `${j.layers} layers × ${j.experts} experts; ${j.resident} cached on the GPU ` +
    `(${((100 * j.resident) / (j.layers * j.experts)).toFixed(0)}%)`;
}

async function poll() {
  try {
    const r = await fetch("/metrics", { headers: headers(false) });
    if (r.status === 503) setStatus("loading", "warn");
    else if (r.status === 401) setStatus("API key needed (Settings)", "bad");
    else if (r.ok) {
      const ms = parseMetrics(await r.text());
      showServer(ms);
      showHistory(ms);
      if (ms.some((x) => /expert_cache_hit/.test(x.name))) await showExperts();
      setStatus("ready", "ok");
      if (!modelName) {
        const m = await fetch("/v1/models", { headers: headers(false) });
        if (m.ok) {
          const j = await m.json();
          modelName = j.data && j.data[0] && j.data[0].id;
          const ctx = j.data && j.data[0] && j.data[0].context_length;
          $("model").textContent = modelName + (ctx ? ` · context ${ctx}` : "");
        }
      }
      const g = await fetch("/metrics/gpu", { headers: headers(false) });
      showGpus(g.ok ? parseMetrics(await g.text()) : []);
    } else setStatus(`error ${r.status}`, "bad");
    $("updated").textContent = "updated " + new Date().toLocaleTimeString();
  } catch (e) {
    setStatus("server unreachable", "bad");
  }
}

$("api_key").value = localStorage.getItem("strata_api_key") || "";
$("api_key").addEventListener("change", () => localStorage.setItem("strata_api_key", $("api_key").value));
poll();
setInterval(poll, 1000);
$("input").focus();
