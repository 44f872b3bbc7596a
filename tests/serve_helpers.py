"""Helpers of the server tests (tests/serve): the tiny preset with a byte-level tokenizer,
a server on a free port in a background thread, and an engine over the same weights.

The tiny preset (vocabulary 256) gets a tokenizer of one token per byte and a minimal
chat template, so text prompts, stop strings and chat run in milliseconds without the
slower real checkpoint.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from typing import Any

from tokenizers import Tokenizer as Backend
from tokenizers import decoders, models, pre_tokenizers

from infbench.core.config import EngineConfig
from infbench.engine.engine import Engine, KVSizing
from infbench.model.loader import LoadedModel, load_model
from infbench.model.tokenizer import Tokenizer
from infbench.serve.app import SERVER_KEY, Server, create_app
from infbench.serve.engine_loop import EngineLoop
from infbench.serve.limits import ServerLimits
from infbench.serve.protocol import ModelContext
from infbench.serve.runtime import serve_app
from infbench.serve.security import Security

MODEL_NAME = "tiny-test"
MAX_MODEL_LEN = 128
CHAT_TEMPLATE = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<assistant>{% endif %}")


def byte_tokenizer() -> Tokenizer:
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())  # one token per byte
    backend = Backend(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return Tokenizer(backend, chat_template=CHAT_TEMPLATE, source="byte-level test tokenizer")


def tiny_model() -> LoadedModel:
    loaded = load_model({"preset": "tiny"}, dtype="float32", device="cpu", seed=0)
    loaded.tokenizer = byte_tokenizer()
    return loaded


def engine_config(max_num_seqs: int = 4) -> EngineConfig:
    return EngineConfig(block_size=4, max_num_seqs=max_num_seqs, max_num_batched_tokens=64,
                        backend="torch", kv_cache_memory=float(64 << 20))


def tiny_engine(max_num_seqs: int = 4,
                loaded: LoadedModel | None = None) -> tuple[Engine, LoadedModel]:
    """An engine over the tiny preset, or over `loaded` (a checkpoint with a tokenizer)."""
    loaded = loaded or tiny_model()
    cfg = engine_config(max_num_seqs)
    engine = Engine.create(loaded, cfg, "cpu", "float32",
                           sizing=KVSizing.for_max_model_len(MAX_MODEL_LEN, cfg), seed=0)
    return engine, loaded


@dataclass
class RunningServer:
    url: str
    engine: Engine
    loop: EngineLoop
    server: Server
    event_loop: asyncio.AbstractEventLoop
    _stop: Any
    _thread: threading.Thread

    def stop(self) -> None:
        self._stop()
        self._thread.join(timeout=30)
        assert not self._thread.is_alive(), "the server did not shut down"


def start_server(max_num_seqs: int = 4, max_queue: int | None = None,
                 start_engine: bool = True, security: Security | None = None,
                 limits: ServerLimits | None = None,
                 shutdown_timeout: float = 5,
                 loaded: LoadedModel | None = None) -> RunningServer:
    engine, loaded = tiny_engine(max_num_seqs, loaded)
    ctx = ModelContext(MODEL_NAME, MAX_MODEL_LEN, loaded.config.vocab_size, max_num_seqs,
                       loaded.tokenizer)
    engine_loop = EngineLoop(engine, max_queue)
    app = create_app(engine_loop, ctx, start_engine=start_engine, security=security,
                     limits=limits)
    bound: dict[str, Any] = {}
    ready = threading.Event()

    def run() -> None:
        async def main() -> None:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            bound["stop"] = lambda: loop.call_soon_threadsafe(stop.set)
            bound["loop"] = loop

            def on_ready(port: int) -> None:
                bound["port"] = port
                ready.set()

            await serve_app(app, "127.0.0.1", 0, stop=stop, ready=on_ready, limits=limits,
                            shutdown_timeout=shutdown_timeout, drain=app[SERVER_KEY].drain)

        asyncio.run(main())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(30), "the server did not start"
    return RunningServer(f"http://127.0.0.1:{bound['port']}", engine, engine_loop,
                         app[SERVER_KEY], bound["loop"], bound["stop"], thread)
