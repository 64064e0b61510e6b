"""The MTP block (--draft mtp) against the NumPy reference (ref_mtp.py), on
`strata synth --preset tiny --mtp` files of qwen35moe, qwen3next, deepseek2
and glm4moe with F32
weights, through mtp_dump (the engine's engine_seq_mtp_logits and
engine_seq_draft_mtp).

Strata runs with STRATA_PRECISE=1 (f32 activations), so what is left is
float32 sums and the cache's f16 rounding, which the reference emulates
("emu": K and V rounded to f16 in the main model's attention layers and the
block's). Errors are max|a - b| / std(ref) over every position's logits.
Bound: err(strata, ref) <= 2 * err(emu, ref) + 2e-3, as test_forward.py.
Checked:
  - the block's logits at all 24 positions (row p from token p and the
    main model's hidden state of p - 1), read in one call and in chunks of 5
    (--ubatch 5: the prompt and the block's catch-up in pieces);
  - the 4 drafts chained after a pending token: each is the argmax of the
    reference's logits for that step (fed the same drafts), wherever the
    reference's top two differ by more than the bound;
  - mutations of the reference (hnorm and enorm swapped, the halves of
    eh_proj's input swapped, h of the same position instead of the one
    before, no attention, no shared expert, the hidden state from before
    the output norm) each exceed the bound;
  - the block's optional tensors: a copy of the file without
    nextn.shared_head_norm (the output norm serves) and with a
    nextn.embed_tokens and nextn.shared_head_head of its own, as other
    converters may write them, within the same bound of the reference, and
    its logits far from the original file's (the tensors are used);
  - a file that counts the block but lacks its tensors, or lacks one of
    them (nextn.hnorm), gives the same main-model logits as the file with
    it (forward_dump) and refuses --draft mtp (the second with a warning
    naming the tensor).
"""
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ref_forward  # noqa: E402
import ref_mtp  # noqa: E402

DUMP = os.environ.get("STRATA_MTP_DUMP")
FWD = os.environ.get("STRATA_FORWARD_DUMP")
STRATA = os.environ.get("STRATA_BIN")
N_TOK = 24
N_DRAFT = 4
FLOOR = 2e-3
Q_FACTOR = 2.0


@pytest.fixture(scope="module", params=["qwen35moe", "qwen3next", "deepseek2", "glm4moe"])
def model(request):
    if not DUMP or not STRATA:
        pytest.skip("STRATA_MTP_DUMP and STRATA_BIN must name mtp_dump and strata")
    arch = request.param
    with tempfile.TemporaryDirectory(prefix="strata_mtp_") as d:
        path = os.path.join(d, "tiny.gguf")
        subprocess.run([STRATA, "synth", "--arch", arch, "--preset", "tiny", "--mtp", "--type-default", "F32",
                        "-o", path, "--quiet"], check=True)
        yield arch, d, path, ref_forward.RefModel(path)


def dump(d, path, toks, *extra):
    out = os.path.join(d, "out.bin")
    env = dict(os.environ, STRATA_PRECISE="1")
    cmd = [DUMP, path, out, "--tokens", ",".join(map(str, toks)), "--threads", "2", *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    lg = np.fromfile(out, dtype=np.float32).reshape(len(toks), -1).astype(np.float64)
    drafts = np.fromfile(out + ".drafts", dtype=np.int32) if os.path.exists(out + ".drafts") else None
    return lg, drafts


TOKS = np.random.default_rng(4321).integers(0, 512, N_TOK)
PENDING = 77


def test_mtp_vs_reference(model):
    arch, d, path, m = model
    s, drafts = dump(d, path, TOKS, "--draft", f"{PENDING},{N_DRAFT}")
    s5, _ = dump(d, path, TOKS, "--ubatch", "5")
    h_ref, h_emu = ref_mtp.hidden(m, TOKS), ref_mtp.hidden(m, TOKS, kv="f16")
    ref = ref_mtp.logits(m, TOKS, h_ref)
    emu = ref_mtp.logits(m, TOKS, h_emu, kv="f16")
    sd = float(ref.std())
    assert sd > 0.01
    e_ref, e_q, e_emu, e_5 = (float(np.abs(a - b).max() / sd) for a, b in ((s, ref), (emu, ref), (s, emu), (s5, s)))
    bound = Q_FACTOR * e_q + FLOOR
    agree = int((s.argmax(1) == ref.argmax(1)).sum())
    print(f"\n{arch} tiny f32 MTP block: err vs ref {e_ref:.1e} (bound {bound:.1e}), vs emu {e_emu:.1e}, "
          f"chunks of 5 vs one call {e_5:.1e}, top-1 {agree}/{N_TOK}")
    assert e_ref <= bound
    assert e_5 <= bound
    # the chained drafts: each step's reference logits, fed the drafts Strata chose
    ch = ref_mtp.chain(m, TOKS, h_ref, PENDING, list(drafts))
    top2 = np.sort(ch, axis=1)[:, -2:]
    decidable = (top2[:, 1] - top2[:, 0]) / sd > 2 * bound
    want = ch.argmax(1)
    print(f"  drafts after {PENDING}: {drafts.tolist()}, reference argmax {want.tolist()}, "
          f"decidable {int(decidable.sum())}/{N_DRAFT}")
    assert decidable.sum() >= N_DRAFT // 2
    assert np.all((drafts == want) | ~decidable)
    for mu in ref_mtp.MUTATIONS:
        e_mu = float(np.abs(s - ref_mtp.logits(m, TOKS, h_ref, mutate=mu)).max() / sd)
        print(f"  mutation {mu}: {e_mu:.1e}")
        assert e_mu > bound, f"mutation {mu} not caught ({e_mu:.1e} <= {bound:.1e})"
    # the hidden state from before the output norm instead of after it
    e_pre = float(np.abs(s - ref_mtp.logits(m, TOKS, ref_mtp.hidden(m, TOKS, pre=True))).max() / sd)
    print(f"  h before the output norm: {e_pre:.1e}")
    assert e_pre > bound, f"h before the output norm not told apart ({e_pre:.1e} <= {bound:.1e})"


def variant(src, dst, arch, drop=("nextn.shared_head_norm.weight",), own=True):
    """src without the block's tensors named in drop (after "blk.{n_layer}."; "*": all of them) and, with own,
    random nextn.embed_tokens and nextn.shared_head_head of its own."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter
    r = GGUFReader(src)
    w = GGUFWriter(dst, arch)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        sub = f.types[-1] if f.types[0] == GGUFValueType.ARRAY else None
        w.add_key_value(name, f.contents(), f.types[0], sub_type=sub)
    blk = f"blk.{int(r.fields[arch + '.block_count'].contents()) - 1}."
    nx = blk + "nextn."
    for t in r.tensors:
        if not (t.name.startswith(blk) and ("*" in drop or t.name[len(blk):] in drop)):
            w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    emb = next(t for t in r.tensors if t.name == "token_embd.weight")
    n_embd, n_vocab = int(emb.shape[0]), int(emb.shape[1])
    rng = np.random.default_rng(11)
    for name in ("embed_tokens.weight", "shared_head_head.weight") if own else ():
        w.add_tensor(nx + name, (0.02 * rng.standard_normal((n_vocab, n_embd))).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_mtp_optional_tensors(model):
    arch, d, path, m = model
    vpath = os.path.join(d, "variant.gguf")
    variant(path, vpath, arch)
    mv = ref_forward.RefModel(vpath)
    assert mv.has(f"blk.{mv.n_layer}.nextn.embed_tokens.weight")
    assert not mv.has(f"blk.{mv.n_layer}.nextn.shared_head_norm.weight")
    s, _ = dump(d, vpath, TOKS)
    s0, _ = dump(d, path, TOKS)
    h_ref, h_emu = ref_mtp.hidden(mv, TOKS), ref_mtp.hidden(mv, TOKS, kv="f16")
    ref = ref_mtp.logits(mv, TOKS, h_ref)
    emu = ref_mtp.logits(mv, TOKS, h_emu, kv="f16")
    sd = float(ref.std())
    e_ref, e_q, e_0 = (float(np.abs(a - b).max() / sd) for a, b in ((s, ref), (emu, ref), (s0, s)))
    bound = Q_FACTOR * e_q + FLOOR
    print(f"\n{arch} block with its own embedding and head, the output norm: err vs ref {e_ref:.1e} "
          f"(bound {bound:.1e}); vs the original file's block {e_0:.1e}")
    assert e_ref <= bound
    assert e_0 > 100 * bound


def test_mtp_block_absent_or_broken(model):
    """A file that counts the block in block_count but lacks its tensors (converted without the MTP head),
    or whose block lacks a required tensor, runs as before (the same logits) and refuses --draft mtp; the
    broken one with a warning naming the tensor."""
    arch, d, path, m = model
    if not FWD:
        pytest.skip("STRATA_FORWARD_DUMP must name forward_dump")
    absent, broken = os.path.join(d, "absent.gguf"), os.path.join(d, "broken.gguf")
    variant(path, absent, arch, drop=("*",), own=False)
    variant(path, broken, arch, drop=("nextn.hnorm.weight",), own=False)
    logits = []
    for f in (path, absent, broken):
        out = os.path.join(d, "fwd.bin")
        r = subprocess.run([FWD, f, out, "--tokens", ",".join(map(str, TOKS)), "--threads", "2"],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        logits.append(np.fromfile(out, dtype=np.float32))
    assert np.array_equal(logits[0], logits[1]) and np.array_equal(logits[0], logits[2])
    r = subprocess.run([DUMP, absent, os.path.join(d, "x.bin"), "--tokens", "1,2,3"], capture_output=True, text=True)
    assert r.returncode == 1 and "no usable multi-token prediction block" in r.stderr, r.stderr
    r = subprocess.run([DUMP, broken, os.path.join(d, "x.bin"), "--tokens", "1,2,3"], capture_output=True, text=True)
    assert r.returncode == 1 and "nextn.hnorm.weight" in r.stderr and "no usable multi-token" in r.stderr, r.stderr
    print(f"\n{arch}: without the block's tensors, or without nextn.hnorm, the same logits; --draft mtp "
          f"refused: {r.stderr.strip()}")
