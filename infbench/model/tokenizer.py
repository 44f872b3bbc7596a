"""Tokenizers from a HF checkpoint directory or from GGUF metadata, plus chat templates.

Wraps the `tokenizers` library.  A GGUF carries no tokenizer.json, only the
vocabulary, merges and token types under llama.cpp's keys; `from_gguf` rebuilds
the byte-level BPE tokenizer those describe.  Chat templates are rendered with
jinja2 only when `apply_chat_template` is called, never implicitly.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as _Backend

from infbench.core.errors import UserError

if TYPE_CHECKING:
    from gguf import GGUFReader

# llama.cpp token types (tokenizer.ggml.token_type)
_CONTROL, _USER_DEFINED = 3, 4
# tokenizer.ggml.pre values that split text with GPT-2's byte-level regex (smollm: digits first)
_GPT2_SPLIT_PRE = ("default", "gpt2", "smollm")


def _byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable unicode character map used by byte-level BPE vocabularies."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)  # unprintable bytes move past Latin-1
            extra += 1
    return table


def _token_text(value: Any) -> str | None:
    """tokenizer_config.json spells special tokens as strings or as AddedToken dicts."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


class Tokenizer:
    """Text <-> token ids, special token ids and the model's chat template."""

    def __init__(
        self,
        backend: _Backend,
        bos_token: str | None = None,
        eos_token: str | None = None,
        chat_template: str | None = None,
        source: str = "",
    ) -> None:
        self.backend = backend
        self.bos_token, self.eos_token = bos_token, eos_token
        self.chat_template = chat_template
        self.source = source

    # ------------------------------------------------------------ constructors
    @classmethod
    def from_hf_dir(cls, path: str | Path) -> Tokenizer:
        root = Path(path)
        tok_file = root / "tokenizer.json"
        if not tok_file.is_file():
            raise UserError(f"{root}: no tokenizer.json (only fast tokenizers are supported)")
        from infbench.checkpoint.metadata import reading

        with reading(tok_file, "tokenizer.json of the `tokenizers` library"):
            backend = _Backend.from_file(str(tok_file))
        cfg: dict[str, Any] = {}
        template: str | None = None
        cfg_file = root / "tokenizer_config.json"
        if cfg_file.is_file():
            with reading(cfg_file, "tokenizer_config.json"):
                cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
                if not isinstance(cfg, dict):
                    raise ValueError(f"expected a JSON object, got {type(cfg).__name__}")
                template = cfg.get("chat_template")
                if isinstance(template, list):  # named: [{"name": ..., "template": ...}]
                    named = {t.get("name"): t.get("template") for t in template}
                    template = named.get("default")
                if template is not None and not isinstance(template, str):
                    raise ValueError("chat_template: expected a string")
        jinja_file = root / "chat_template.jinja"  # transformers >= 4.47 saves it separately
        if template is None and jinja_file.is_file():
            with reading(jinja_file, "UTF-8 text file"):
                template = jinja_file.read_text(encoding="utf-8")
        return cls(
            backend,
            bos_token=_token_text(cfg.get("bos_token")),
            eos_token=_token_text(cfg.get("eos_token")),
            chat_template=template,
            source=str(root),
        )

    @classmethod
    def from_gguf(cls, reader_or_path: GGUFReader | str | Path) -> Tokenizer:
        from infbench.checkpoint.metadata import open_gguf, reading

        if isinstance(reader_or_path, str | Path):
            reader = open_gguf(reader_or_path)
        else:
            reader = reader_or_path
        name = str(reader.data.filename)
        # Damaged metadata (token ids past the vocabulary, merges that are not strings, ...)
        # fails inside `tokenizers` or here: one error naming the file.
        with reading(name, "GGUF file with a usable tokenizer"):
            return cls._from_gguf_reader(reader, name)

    @classmethod
    def _from_gguf_reader(cls, reader: GGUFReader, name: str) -> Tokenizer:
        from infbench.checkpoint.metadata import gguf_value

        model = gguf_value(reader, "tokenizer.ggml.model")
        if model == "llama":
            return cls._from_gguf_spm(reader, name)
        if model != "gpt2":
            raise UserError(
                f"{name}: tokenizer.ggml.model {model!r} unsupported; "
                "supported: gpt2 (byte-level BPE), llama (SentencePiece BPE, byte fallback)"
            )
        pre = gguf_value(reader, "tokenizer.ggml.pre", "default")
        if pre not in _GPT2_SPLIT_PRE:
            raise UserError(
                f"{name}: tokenizer.ggml.pre {pre!r} unsupported; "
                f"supported: {', '.join(_GPT2_SPLIT_PRE)}"
            )
        tokens: list[str] = gguf_value(reader, "tokenizer.ggml.tokens")
        types: list[int] = gguf_value(reader, "tokenizer.ggml.token_type") or [1] * len(tokens)
        merges: list[str] = gguf_value(reader, "tokenizer.ggml.merges") or []
        alphabet = _byte_alphabet()
        spelled = set(alphabet.values())
        # Every BPE token is spelled in the byte alphabet; respell the rare raw-UTF-8 entry.
        vocab = {
            tok if set(tok) <= spelled else "".join(alphabet[b] for b in tok.encode()): i
            for i, tok in enumerate(tokens)
        }
        pairs = [(left, right) for left, _, right in (m.partition(" ") for m in merges)]
        backend = _Backend(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False))
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        if pre == "smollm":  # SmolLM's own tokenizer.json splits digits one by one first
            backend.pre_tokenizer = pre_tokenizers.Sequence(
                [pre_tokenizers.Digits(individual_digits=True), byte_level]
            )
        else:
            backend.pre_tokenizer = byte_level
        backend.decoder = decoders.ByteLevel()
        # Control tokens (<|im_start|>, ...) must match whole, never be split by BPE.
        typed = list(zip(tokens, types, strict=True))
        backend.add_special_tokens(
            [
                AddedToken(t, special=True, normalized=False)
                for t, k in typed
                if k == _CONTROL and set(t) <= spelled
            ]
        )
        backend.add_tokens(
            [AddedToken(t, special=False, normalized=False) for t, k in typed if k == _USER_DEFINED]
        )
        special: dict[str, str | None] = {}
        for key in ("bos", "eos"):
            index = gguf_value(reader, f"tokenizer.ggml.{key}_token_id")
            special[key] = tokens[int(index)] if index is not None else None
        _add_template_processor(
            backend,
            special["bos"] if gguf_value(reader, "tokenizer.ggml.add_bos_token", False) else None,
            special["eos"] if gguf_value(reader, "tokenizer.ggml.add_eos_token", False) else None,
        )
        return cls(
            backend,
            bos_token=special["bos"],
            eos_token=special["eos"],
            chat_template=gguf_value(reader, "tokenizer.chat_template"),
            source=name,
        )

    @classmethod
    def _from_gguf_spm(cls, reader: GGUFReader, name: str) -> Tokenizer:
        """A SentencePiece (llama-type) vocabulary: `model.gguf_tokenizer` builds the backend;
        BOS is added unless the file says otherwise (llama.cpp's and transformers' default)."""
        from infbench.checkpoint.metadata import gguf_value
        from infbench.model.gguf_tokenizer import spm_backend

        tokens: list[str] = gguf_value(reader, "tokenizer.ggml.tokens")
        scores = gguf_value(reader, "tokenizer.ggml.scores") or [0.0] * len(tokens)
        types = gguf_value(reader, "tokenizer.ggml.token_type") or [1] * len(tokens)
        special: dict[str, str | None] = {}
        for key in ("bos", "eos", "unknown", "padding"):
            index = gguf_value(reader, f"tokenizer.ggml.{key}_token_id")
            if index is not None and not 0 <= int(index) < len(tokens):
                raise ValueError(f"tokenizer.ggml.{key}_token_id {index} is not a token id "
                                 f"(the vocabulary has {len(tokens)})")
            special[key] = tokens[int(index)] if index is not None else None
        unk = gguf_value(reader, "tokenizer.ggml.unknown_token_id")
        backend = spm_backend(tokens, scores, types, None if unk is None else int(unk),
                              bool(gguf_value(reader, "tokenizer.ggml.add_space_prefix", True)))
        _add_template_processor(
            backend,
            special["bos"] if gguf_value(reader, "tokenizer.ggml.add_bos_token", True) else None,
            special["eos"] if gguf_value(reader, "tokenizer.ggml.add_eos_token", False) else None,
        )
        return cls(backend, bos_token=special["bos"], eos_token=special["eos"],
                   chat_template=gguf_value(reader, "tokenizer.chat_template"), source=name)

    # ------------------------------------------------------------------- use
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids; add_special_tokens adds BOS/EOS where the tokenizer is configured to.

        Text that is not valid Unicode (a lone surrogate: JSON's "\\ud800", or undecodable
        bytes that Python's argv decoding keeps as surrogate escapes) is a UserError."""
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise UserError(f"text is not valid UTF-8: {text[exc.start:exc.end]!a} at character "
                            f"{exc.start}") from None
        return list(self.backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return str(self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **kwargs: Any
    ) -> str:
        """Render the model's chat template (as text; `encode` it without special tokens)."""
        if not self.chat_template:
            name = self.source or "(unnamed)"
            raise UserError(f"tokenizer {name}: the model has no chat template")
        # The environment transformers renders templates in, so outputs agree.
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_template_error
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            template = env.from_string(self.chat_template)
            return template.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token or "",
                eos_token=self.eos_token or "",
                **kwargs,
            )
        except jinja2.TemplateError as exc:
            raise UserError(f"chat template of {self.source or 'the tokenizer'}: {exc}") from None

    @property
    def bos_token_id(self) -> int | None:
        return self.backend.token_to_id(self.bos_token) if self.bos_token else None

    @property
    def eos_token_id(self) -> int | None:
        return self.backend.token_to_id(self.eos_token) if self.eos_token else None

    @property
    def vocab_size(self) -> int:
        return int(self.backend.get_vocab_size(with_added_tokens=True))


def _tojson(value: Any, indent: int | None = None) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _raise_template_error(message: str) -> None:
    raise jinja2.TemplateError(message)


def _add_template_processor(backend: _Backend, bos: str | None, eos: str | None) -> None:
    """Prepend BOS / append EOS on encode(add_special_tokens=True), as llama.cpp's flags ask."""
    if bos is None and eos is None:
        return
    pre, post = ([f"{bos}:0"] if bos else []), ([f"{eos}:0"] if eos else [])
    ids = [(t, backend.token_to_id(t)) for t in (bos, eos) if t]
    backend.post_processor = processors.TemplateProcessing(
        single=[*pre, "$A:0", *post],
        pair=[*pre, "$A:0", *post, *pre, "$B:1", *post],
        special_tokens=ids,
    )
