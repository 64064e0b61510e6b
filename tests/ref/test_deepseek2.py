"""deepseek2: Strata's forward pass (absorbed multi-head latent attention over
the latent cache) against the naive NumPy reference (ref_deepseek2.py:
decompressed keys and values, HF's rotary and MoEGate), on the synth `tiny`
preset with F32 weights (a dense layer, two MoE layers, 2 expert groups of
which one is kept, YaRN x4, q_lora > 0), written by `strata synth`.

Strata runs with STRATA_PRECISE=1 (f32 activations), so the errors left are
float32 sums and the cache's rounding; the reference emulates the latter
("emu": the cache row [rope(k_pe), norm(c_kv)] rounded to f16, or int8 with
one scale per row). Errors are max|a - b| / std(ref) over 32 positions x 512
logits. Bound: err(strata, ref) <= 2 * err(emu, ref) + 2e-3, as
test_forward.py; err(strata, emu) is printed (~3e-5 with an f16 cache).
Split: the first 16 tokens in one call, the rest one by one (decode through
the cache), ubatch 5: equal to the one-call logits within 1e-4.
Mutations of the reference (a wrong group rule, no group limit, no mscale,
no YaRN, NeoX pairs, softmax gate, no bias, no scale, no shared expert) must
each exceed the bound.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ref_deepseek2  # noqa: E402
import ref_forward  # noqa: E402

DUMP = os.environ.get("STRATA_FORWARD_DUMP")
STRATA = os.environ.get("STRATA_BIN")
N_TOK = 32
FLOOR = 2e-3
Q_FACTOR = 2.0
SPLIT_TOL = 1e-4


@pytest.fixture(scope="module")
def model():
    if not DUMP or not STRATA:
        pytest.skip("STRATA_FORWARD_DUMP and STRATA_BIN must name forward_dump and strata")
    with tempfile.TemporaryDirectory(prefix="strata_ds2_") as d:
        path = os.path.join(d, "tiny.gguf")
        subprocess.run([STRATA, "synth", "--arch", "deepseek2", "--preset", "tiny", "--type-default", "F32",
                        "-o", path, "--quiet"], check=True)
        yield d, path, ref_forward.RefModel(path)


def dump(d, path, toks, kv, *extra):
    out = os.path.join(d, "out.bin")
    env = dict(os.environ, STRATA_PRECISE="1")
    cmd = [DUMP, path, out, "--tokens", ",".join(map(str, toks)), "--threads", "2", "--ctx", "40", "--kv", kv, *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    return np.fromfile(out, dtype=np.float32).reshape(len(toks), -1).astype(np.float64)


TOKS = np.random.default_rng(1234).integers(0, 512, N_TOK)


@pytest.mark.parametrize("kv", ["f16", "int8"])
def test_vs_reference(model, kv):
    d, path, m = model
    s = dump(d, path, TOKS, kv)
    ref = ref_deepseek2.forward(m, TOKS)
    emu = ref_deepseek2.forward(m, TOKS, kv=kv)
    sd = float(ref.std())
    assert sd > 0.1
    e_ref, e_q, e_emu = (float(np.abs(a - b).max() / sd) for a, b in ((s, ref), (emu, ref), (s, emu)))
    bound = Q_FACTOR * e_q + FLOOR
    agree = int((s.argmax(1) == ref.argmax(1)).sum())
    print(f"\ndeepseek2 tiny f32, kv {kv}: err vs ref {e_ref:.1e} (bound {bound:.1e}), vs emu {e_emu:.1e}, "
          f"top-1 {agree}/{N_TOK}")
    assert e_ref <= bound
    if kv == "f16":
        for mu in ref_deepseek2.MUTATIONS:
            e_mu = float(np.abs(s - ref_deepseek2.forward(m, TOKS, mutate=mu)).max() / sd)
            print(f"  mutation {mu}: {e_mu:.1e}")
            assert e_mu > bound, f"mutation {mu} not caught ({e_mu:.1e} <= {bound:.1e})"


def test_split_decode(model):
    d, path, m = model
    one = dump(d, path, TOKS, "f16")
    split = dump(d, path, TOKS, "f16", "--split", "--ubatch", "5")
    e = float(np.abs(one - split).max() / one.std())
    print(f"\ndeepseek2 split (16 in one call, then one by one, ubatch 5) vs one call: {e:.1e}")
    assert e <= SPLIT_TOL


V2_DROP_KEYS = ("attention.q_lora_rank", "expert_gating_func", "expert_group_count", "expert_group_used_count",
                "rope.scaling.type", "rope.scaling.factor", "rope.scaling.original_context_length",
                "rope.scaling.yarn_log_multiplier")


def rewrite(src, dst, drop_key=None, mtp=False, v2=False):
    """A copy of src without metadata key drop_key; or (mtp) with an MTP layer
    appended as llama.cpp's converter writes one: nextn_predict_layers = 1,
    block_count + 1, a copy of the last layer plus its nextn.* tensors; or
    (v2) in DeepSeek-V2(-Lite)'s form: a plain attn_q (no q_lora_rank),
    softmax routing (no expert_gating_func), no selection bias, no groups,
    no YaRN."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter
    r = GGUFReader(src)
    w = GGUFWriter(dst, "deepseek2")
    n_layer = int(r.fields["deepseek2.block_count"].contents())
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name == drop_key:
            continue
        if v2 and name[len("deepseek2."):] in V2_DROP_KEYS:
            continue
        val = f.contents()
        if mtp and name == "deepseek2.block_count":
            val = n_layer + 1
        if mtp and name == "deepseek2.nextn_predict_layers":
            val = 1
        sub = f.types[-1] if f.types[0] == GGUFValueType.ARRAY else None
        w.add_key_value(name, val, f.types[0], sub_type=sub)
    rng = np.random.default_rng(7)
    last = f"blk.{n_layer - 1}."
    for t in r.tensors:
        if v2 and (t.name.endswith("exp_probs_b.bias") or ".attn_q_a" in t.name):
            continue
        if v2 and t.name.endswith("attn_q_b.weight"):  # a random plain attn_q {n_embd, n_head * key_length_mla}
            n_embd = int(r.fields["deepseek2.embedding_length"].contents())
            q = (0.02 * rng.standard_normal((int(t.shape[1]), n_embd))).astype(np.float32)
            w.add_tensor(t.name.replace("attn_q_b", "attn_q"), q)
            continue
        w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    if mtp:
        n_embd = int(r.fields["deepseek2.embedding_length"].contents())
        for t in r.tensors:
            if t.name.startswith(last):
                w.add_tensor(f"blk.{n_layer}." + t.name[len(last):], np.asarray(t.data), raw_dtype=t.tensor_type)
        nx = f"blk.{n_layer}.nextn."
        w.add_tensor(nx + "eh_proj.weight", (0.02 * rng.standard_normal((n_embd, 2 * n_embd))).astype(np.float32))
        for norm in ("enorm", "hnorm", "shared_head_norm"):
            w.add_tensor(nx + norm + ".weight", np.ones(n_embd, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_mtp_layer_skipped(model):
    """The MTP layer counted in block_count is loaded past, not run: the same logits."""
    d, path, m = model
    mtp = os.path.join(d, "mtp.gguf")
    rewrite(path, mtp, mtp=True)
    a, b = dump(d, path, TOKS, "f16"), dump(d, mtp, TOKS, "f16")
    print(f"\ndeepseek2 with an MTP layer vs without: {np.abs(a - b).max():.1e}")
    assert np.array_equal(a, b)


@pytest.mark.parametrize("key", ["deepseek2.attention.kv_lora_rank", "deepseek2.attention.key_length_mla",
                                 "deepseek2.expert_group_used_count", "deepseek2.rope.scaling.yarn_log_multiplier"])
def test_missing_key_named(model, key):
    d, path, m = model
    bad = os.path.join(d, "bad.gguf")
    rewrite(path, bad, drop_key=key)
    r = subprocess.run([DUMP, bad, os.path.join(d, "x.bin"), "--tokens", "1,2,3"], capture_output=True, text=True)
    assert r.returncode != 0 and key in r.stderr, r.stderr


def test_v2_form(model):
    """DeepSeek-V2(-Lite)'s form: plain attn_q, softmax routing, no bias, no groups, no YaRN."""
    d, path, m = model
    v2 = os.path.join(d, "v2.gguf")
    rewrite(path, v2, v2=True)
    m2 = ref_forward.RefModel(v2)
    assert not m2.has("blk.1.attn_q_a.weight") and m2.has("blk.1.attn_q.weight")
    s = dump(d, v2, TOKS, "f16")
    ref = ref_deepseek2.forward(m2, TOKS)
    emu = ref_deepseek2.forward(m2, TOKS, kv="f16")
    sd = float(ref.std())
    e_ref, e_q = float(np.abs(s - ref).max() / sd), float(np.abs(emu - ref).max() / sd)
    bound = Q_FACTOR * e_q + FLOOR
    print(f"\ndeepseek2 in V2's form (plain attn_q, softmax, no groups, no YaRN): err vs ref {e_ref:.1e} "
          f"(bound {bound:.1e}), top-1 {int((s.argmax(1) == ref.argmax(1)).sum())}/{N_TOK}")
    assert e_ref <= bound
    e_mu = float(np.abs(s - ref_deepseek2.forward(m2, TOKS, mutate="no_softmax_gate")).max() / sd)
    assert e_mu > bound, f"sigmoid instead of softmax not caught ({e_mu:.1e})"


def zipf_fit(path, layer, groups, kept, n=4000):
    """synth's --zipf hidden-state model (docs/synth.md) routed by sigmoid and
    the group rule (groups of the router's experts, kept best by their top-2
    sums), then top-k: the fitted rank-frequency exponent over ranks 2.."""
    from gguf import GGUFReader
    r = GGUFReader(path)
    u = np.array(r.fields["strata.synth.router_dir"].contents(), dtype=np.float64)
    mean = r.fields["strata.synth.router_dir_mean"].contents()
    k = int(r.fields["deepseek2.expert_used_count"].contents())
    w = [t for t in r.tensors if t.name == f"blk.{layer}.ffn_gate_inp.weight"][0]
    W = np.asarray(w.data, dtype=np.float64)
    h = mean * u[None, :] + np.random.default_rng(1234 + layer).standard_normal((n, W.shape[1]))
    s = 1.0 / (1.0 + np.exp(-(h @ W.T)))
    E = W.shape[0]
    gs = np.sort(s.reshape(n, groups, E // groups), axis=-1)[..., -2:].sum(-1)
    mask = np.zeros((n, groups), dtype=bool)
    np.put_along_axis(mask, np.argsort(-gs, axis=-1)[:, :kept], True, axis=-1)
    s = np.where(np.repeat(mask, E // groups, axis=-1), s, -np.inf)
    freq = np.sort(np.bincount(np.argsort(-s, axis=1)[:, :k].ravel(), minlength=E))[::-1] / n
    ranks = np.arange(1, E + 1)
    return -np.polyfit(np.log(ranks[1:]), np.log(np.maximum(freq[1:], 0.5 / n)), 1)[0]


def test_zipf_with_groups(model):
    """--zipf 1 on 256 experts top-8: the skew survives the group rule, the
    file's own (2 groups, 1 kept) and DeepSeek-V3's (8 groups, 4 kept)."""
    d, path, m = model
    z = os.path.join(d, "zipf.gguf")
    subprocess.run([STRATA, "synth", "--arch", "deepseek2", "--preset", "tiny", "--zipf", "1", "--experts", "256",
                    "--experts-used", "8", "--seed", "3", "-o", z, "--quiet"], check=True, capture_output=True)
    for groups, kept in ((2, 1), (8, 4)):
        for layer in (1, 2):
            fit = zipf_fit(z, layer, groups, kept)
            print(f"\nzipf 1, 256 experts top-8, {groups} groups ({kept} kept), layer {layer}: exponent {fit:.2f}")
            assert abs(fit - 1.0) <= 0.3
