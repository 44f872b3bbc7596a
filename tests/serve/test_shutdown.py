"""Shutdown as documented: requests still held when the grace time ends get an SSE error
event and [DONE] (streams) or a 503 error object (whole responses); a second signal
exits at once.  (tests/serve/test_serve_cli.py checks that a request finishing within
the grace time is served whole and the process exits 0.)"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
from serve_helpers import start_server

GRACE_S = 0.3


def test_requests_past_the_grace_time_end_with_errors_not_cuts() -> None:
    # The engine never runs, so both requests are still held when the grace time ends.
    srv = start_server(start_engine=False, shutdown_timeout=GRACE_S)
    body = {"prompt": [1, 2, 3], "max_tokens": 5}

    async def go() -> tuple[tuple[int, bytes], tuple[int, Any], float]:
        async with aiohttp.ClientSession() as s:
            async def streamed() -> tuple[int, bytes]:
                async with s.post(srv.url + "/v1/completions", json={**body, "stream": True}) \
                        as r:
                    return r.status, await r.read()

            async def whole() -> tuple[int, Any]:
                async with s.post(srv.url + "/v1/completions", json=body) as r:
                    return r.status, await r.json()

            tasks = asyncio.gather(streamed(), whole())
            deadline = time.monotonic() + 10
            while srv.loop.num_outstanding < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            t0 = time.monotonic()
            srv._stop()  # what SIGTERM does
            got_stream, got_whole = await tasks
            return got_stream, got_whole, time.monotonic() - t0

    (s_status, raw), (w_status, w_body), elapsed = asyncio.run(go())
    srv._thread.join(30)
    assert not srv._thread.is_alive()
    assert GRACE_S <= elapsed < 5  # they had the grace time, then were ended
    assert s_status == 200
    events = [e for e in raw.decode().split("\n\n") if e]
    assert events[-1] == "data: [DONE]" and len(events) == 2, raw
    err = json.loads(events[0].removeprefix("data: "))["error"]
    assert err["code"] == "shutting_down" and err["type"] == "server_error"
    assert w_status == 503 and w_body["error"]["code"] == "shutting_down"
    assert "shutdown timeout" in w_body["error"]["message"]


def test_a_second_signal_exits_at_once() -> None:
    from infbench.serve.replicas import free_port

    port = free_port()
    exe = Path(sys.executable).with_name("infbench")
    proc = subprocess.Popen(
        [str(exe), "serve", "--model", "tiny", "--device", "cpu", "--dtype", "float32",
         "--backend", "torch", "--port", str(port), "--max-model-len", "1024",
         "--max-num-seqs", "1", "--shutdown-timeout", "600"],
        stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert proc.stderr is not None
        while "Ctrl-C stops" not in (line := proc.stderr.readline()):
            assert line, "the server exited before it was ready"
        url = f"http://127.0.0.1:{port}/v1/completions"

        def long_request() -> None:
            req = urllib.request.Request(url, json.dumps({
                "prompt": [5, 6], "max_tokens": 1000, "ignore_eos": True}).encode(),
                {"Content-Type": "application/json"})
            try:
                urllib.request.urlopen(req, timeout=120).read()
            except OSError:
                pass  # the forced exit drops it

        threading.Thread(target=long_request, daemon=True).start()
        queued = [long_request for _ in range(3)]  # more than the one sequence: they wait
        for fn in queued:
            threading.Thread(target=fn, daemon=True).start()
        time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        assert "SIGTERM, stopping" in proc.stderr.readline()
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(20) == 128 + signal.SIGINT
        assert time.monotonic() - t0 < 10
        assert "SIGINT again, exiting now" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
