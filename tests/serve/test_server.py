"""The server end to end over HTTP: outputs against the in-process engine, the openai
package, SSE framing, stop strings, disconnects, a bounded load test, errors, 429 and
/metrics.  One server (tiny preset, 4 sequences at once) serves the module."""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from typing import Any

import aiohttp
import openai
import pytest
from serve_helpers import MAX_MODEL_LEN, MODEL_NAME, RunningServer, start_server, tiny_engine

from infbench.engine.request import Request, SamplingParams


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def post(url: str, body: Any, *, raw: bytes | None = None) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session:
        data = raw if raw is not None else json.dumps(body).encode()
        async with session.post(url, data=data,
                                headers={"Content-Type": "application/json"}) as resp:
            return resp.status, await resp.json(content_type=None)


async def post_stream(session: aiohttp.ClientSession, url: str, body: Any) -> list[Any]:
    """The SSE events of a streamed request, checked for framing; [DONE] last."""
    async with session.post(url, json=body) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        text = (await resp.read()).decode()
    assert text.endswith("\n\n")
    events = text[:-2].split("\n\n")
    assert all(e.startswith("data: ") and "\n" not in e for e in events), text
    assert events[-1] == "data: [DONE]"
    return [json.loads(e.removeprefix("data: ")) for e in events[:-1]]


def wait_idle(srv: RunningServer, free0: int, timeout: float = 20.0) -> None:
    """Until no request is held and every KV block is free again."""
    deadline = time.monotonic() + timeout
    engine = srv.engine
    while time.monotonic() < deadline:
        if (srv.loop.num_outstanding == 0 and not engine.scheduler.has_unfinished
                and engine.block_manager.num_free_blocks == free0
                and srv.loop.stats.num_running == 0):
            return
        time.sleep(0.02)
    raise AssertionError(f"not idle: {srv.loop.num_outstanding} held, "
                         f"{engine.block_manager.num_free_blocks}/{free0} blocks free")


def test_health_and_models(server: RunningServer) -> None:
    async def go() -> None:
        async with aiohttp.ClientSession() as s:
            async with s.get(server.url + "/health") as r:
                assert r.status == 200
            async with s.get(server.url + "/v1/models") as r:
                body = await r.json()
        assert body["object"] == "list" and [m["id"] for m in body["data"]] == [MODEL_NAME]
        assert body["data"][0]["max_model_len"] == MAX_MODEL_LEN
    run(go())
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    assert [m.id for m in client.models.list()] == [MODEL_NAME]


def test_greedy_outputs_equal_the_in_process_engine(server: RunningServer) -> None:
    prompts = [[5, 6, 7], list(range(10, 33)), [200] * 9, list(range(40, 45)), [1]]
    lengths = [12, 5, 20, 1, 30]
    reference_engine, _ = tiny_engine()
    ref = reference_engine.run(
        [Request(f"p{i}", tuple(p), SamplingParams(max_tokens=m, ignore_eos=True))
         for i, (p, m) in enumerate(zip(prompts, lengths, strict=True))],
        realtime_arrivals=False).outputs

    async def go() -> list[tuple[int, Any]]:
        return await asyncio.gather(*[
            post(server.url + "/v1/completions",
                 {"model": MODEL_NAME, "prompt": p, "max_tokens": m, "temperature": 0,
                  "return_token_ids": True})
            for p, m in zip(prompts, lengths, strict=True)])

    tok = server.server.ctx.tokenizer
    assert tok is not None
    for i, (status, body) in enumerate(run(go())):
        assert status == 200, body
        choice = body["choices"][0]
        assert choice["token_ids"] == ref[f"p{i}"]
        assert choice["text"] == tok.decode(ref[f"p{i}"], skip_special_tokens=True)
        assert choice["finish_reason"] == "length"
        assert body["usage"] == {"prompt_tokens": len(prompts[i]),
                                 "completion_tokens": lengths[i],
                                 "total_tokens": len(prompts[i]) + lengths[i]}


def test_openai_package_completions_and_chat(server: RunningServer) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    full = client.completions.create(model=MODEL_NAME, prompt="Hello, world", max_tokens=10,
                                     temperature=0)
    assert full.object == "text_completion" and full.choices[0].finish_reason == "length"
    assert full.usage is not None and full.usage.completion_tokens == 10
    assert full.usage.prompt_tokens == len("Hello, world")
    chunks = list(client.completions.create(
        model=MODEL_NAME, prompt="Hello, world", max_tokens=10, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert not chunks[-1].choices and chunks[-1].usage is not None
    assert chunks[-1].usage.total_tokens == full.usage.total_tokens

    messages: Any = [{"role": "system", "content": "be brief"},
                     {"role": "user", "content": "Hi there"}]
    chat = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=8,
                                          temperature=0, seed=1)
    assert chat.object == "chat.completion"
    assert chat.choices[0].message.role == "assistant"
    assert chat.usage is not None and chat.usage.completion_tokens == 8
    assert chat.usage.prompt_tokens == len("<system>be brief\n<user>Hi there\n<assistant>")
    stream = list(client.chat.completions.create(
        model=MODEL_NAME, messages=messages, max_tokens=8, temperature=0, stream=True))
    assert stream[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in stream) == \
        chat.choices[0].message.content
    assert stream[-1].choices[0].finish_reason == "length"

    # Sampling with a seed repeats; n samples come back with their indices.
    sampled = [client.completions.create(model=MODEL_NAME, prompt="abc", max_tokens=12,
                                         temperature=1.0, top_p=0.9, seed=7, n=3)
               for _ in range(2)]
    assert [c.text for c in sampled[0].choices] == [c.text for c in sampled[1].choices]
    assert [c.index for c in sampled[0].choices] == [0, 1, 2]
    assert len({c.text for c in sampled[0].choices}) > 1  # the samples differ
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="nope", prompt="x", max_tokens=1)


def test_sse_framing_usage_chunk_and_n_choices(server: RunningServer) -> None:
    async def go() -> tuple[list[Any], list[Any]]:
        async with aiohttp.ClientSession() as s:
            plain = await post_stream(s, server.url + "/v1/completions", {
                "prompt": [3, 4, 5], "max_tokens": 6, "n": 2, "temperature": 0.8, "seed": 1,
                "stream": True, "stream_options": {"include_usage": True},
                "return_token_ids": True})
            chat = await post_stream(s, server.url + "/v1/chat/completions", {
                "messages": [{"role": "user", "content": "x"}], "max_tokens": 3,
                "stream": True})
        return plain, chat

    plain, chat = run(go())
    *body, last = plain
    assert last["choices"] == [] and last["usage"] == {
        "prompt_tokens": 3, "completion_tokens": 12, "total_tokens": 15}
    assert all(e["usage"] is None and e["object"] == "text_completion" for e in body)
    assert len({e["id"] for e in plain}) == 1
    for index in (0, 1):
        mine = [e["choices"][0] for e in body if e["choices"][0]["index"] == index]
        assert sum(len(c["token_ids"]) for c in mine) == 6
        assert [c["finish_reason"] for c in mine][-1] == "length"
        assert all(c["finish_reason"] is None for c in mine[:-1])
    assert all(e["object"] == "chat.completion.chunk" and "usage" not in e for e in chat)


def test_stop_strings_and_stop_token_ids(server: RunningServer) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    prompt = "The quick brown fox"
    full = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=40,
                                     temperature=0, extra_body={"return_token_ids": True})
    text = full.choices[0].text
    ids = full.choices[0].model_extra["token_ids"]  # type: ignore[index]
    # A stop string from the middle of the greedy text, without replacement characters.
    start = next(i for i in range(8, len(text) - 3) if "\ufffd" not in text[i:i + 3])
    stop = text[start:start + 3]
    cut = text[:text.index(stop)]
    done = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=40,
                                     temperature=0, stop=[stop, "never-there"])
    assert done.choices[0].text == cut and done.choices[0].finish_reason == "stop"
    assert done.usage is not None and done.usage.completion_tokens < 40
    streamed = list(client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=40,
                                              temperature=0, stop=stop, stream=True))
    assert "".join(c.choices[0].text for c in streamed) == cut
    assert streamed[-1].choices[0].finish_reason == "stop"
    # A stop token id ends the sample at its first occurrence (the token included).
    k = 6
    by_id = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=40,
                                      temperature=0,
                                      extra_body={"stop_token_ids": [ids[k]],
                                                  "return_token_ids": True})
    got = by_id.choices[0].model_extra["token_ids"]  # type: ignore[index]
    assert got == ids[:ids.index(ids[k]) + 1] and by_id.choices[0].finish_reason == "stop"


def test_client_disconnect_aborts_and_frees_blocks(server: RunningServer) -> None:
    free0 = server.engine.block_manager.num_free_blocks
    aborted0 = server.server.metrics.requests_finished["abort"]
    seqs0 = server.loop.num_aborted

    async def go() -> None:
        async with aiohttp.ClientSession() as s:
            resp = await s.post(server.url + "/v1/completions", json={
                "prompt": list(range(1, 9)), "max_tokens": 110, "stream": True,
                "ignore_eos": True, "n": 2})
            await resp.content.readline()  # the first event has arrived
            resp.close()  # hang up mid-stream
        with pytest.raises(asyncio.TimeoutError):  # a non-streamed request, given up on
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.05)) as s:
                await s.post(server.url + "/v1/completions",
                             json={"prompt": [1, 2, 3], "max_tokens": 120})

    run(go())
    wait_idle(server, free0)
    assert server.server.metrics.requests_finished["abort"] == aborted0 + 2
    assert server.loop.num_aborted == seqs0 + 3  # both samples of the stream, and the other


def test_bounded_load_ends_without_errors_or_leaks(server: RunningServer) -> None:
    free0 = server.engine.block_manager.num_free_blocks
    num_requests, concurrency = 200, 16  # 4 sequences at once in the engine

    async def one(s: aiohttp.ClientSession, i: int, gate: asyncio.Semaphore) -> int:
        async with gate:
            body = {"prompt": [1 + i % 50, 2, 3 + i % 7], "max_tokens": 2 + i % 5,
                    "temperature": 0.7, "seed": i}
            if i % 3 == 0:
                body |= {"stream": True}
                async with s.post(server.url + "/v1/completions", json=body) as r:
                    assert (await r.read()).endswith(b"data: [DONE]\n\n")
                    return r.status
            async with s.post(server.url + "/v1/completions", json=body) as r:
                assert len((await r.json())["choices"]) == 1
                return r.status

    async def go() -> list[int]:
        gate = asyncio.Semaphore(concurrency)
        async with aiohttp.ClientSession() as s:
            return await asyncio.gather(*[one(s, i, gate) for i in range(num_requests)])

    statuses = run(go())
    assert statuses == [200] * num_requests
    wait_idle(server, free0)


@pytest.mark.parametrize(("path", "raw", "param"), [
    ("/v1/completions", b"{not json", None),
    ("/v1/completions", b"[1, 2]", None),
    ("/v1/completions", b'{"model": "gpt-4", "prompt": "x"}', "model"),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": 0}', "max_tokens"),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": 500}', "max_tokens"),
    ("/v1/completions", b'{"prompt": [' + b",".join([b"1"] * 130) + b"]}", "prompt"),
    ("/v1/completions", b'{"prompt": "x", "top_p": "high"}', "top_p"),
    ("/v1/chat/completions", b'{"messages": "hi"}', "messages"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "n": 0}', "n"),
])
def test_malformed_requests_get_400_json_errors(server: RunningServer, path: str, raw: bytes,
                                                param: str | None) -> None:
    status, body = run(post(server.url + path, None, raw=raw))
    assert status == 400
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == "invalid_request_error" and body["error"]["message"]
    assert body["error"]["param"] == param


def test_full_queue_answers_429() -> None:
    srv = start_server(max_num_seqs=1, max_queue=1, start_engine=False)
    try:
        async def go() -> tuple[list[tuple[int, Any]], tuple[int, Any]]:
            body = {"prompt": [1, 2, 3], "max_tokens": 3}
            held = [asyncio.create_task(post(srv.url + "/v1/completions", body))
                    for _ in range(2)]
            deadline = time.monotonic() + 10
            while srv.loop.num_outstanding < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            refused = await post(srv.url + "/v1/completions", body)
            srv.loop.start(srv.event_loop)  # now the engine serves the two held requests
            return list(await asyncio.gather(*held)), refused

        held, (status, body) = run(go())
        assert status == 429 and body["error"]["code"] == "queue_full"
        assert [s for s, _ in held] == [200, 200]
    finally:
        srv.stop()


_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$')


def scrape(url: str) -> dict[str, float]:
    """/metrics as {name{labels}: value}, checking the text format on the way."""
    async def get() -> str:
        async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
            assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
            return await r.text()

    samples: dict[str, float] = {}
    types: dict[str, str] = {}
    for line in run(get()).splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in ("counter", "gauge", "histogram")
            types[name] = kind
        elif line.startswith("# HELP ") or not line:
            continue
        else:
            m = _SAMPLE.match(line)
            assert m, line
            value = float(m.group(3))
            assert not math.isnan(value)
            samples[m.group(1) + (m.group(2) or "")] = value
    for name, kind in types.items():
        assert any(k.startswith(name) for k in samples), name
        if kind == "histogram":  # cumulative buckets, +Inf == count
            buckets = [v for k, v in samples.items() if k.startswith(name + "_bucket")]
            assert buckets == sorted(buckets)
            assert buckets[-1] == samples[f'{name}_count{{model_name="{MODEL_NAME}"}}']
    return samples


def test_metrics_count_what_was_served(server: RunningServer) -> None:
    label = f'{{model_name="{MODEL_NAME}"}}'
    before = scrape(server.url)
    bodies = [{"prompt": [1, 2, 3, 4], "max_tokens": 5},
              {"prompt": "hello", "max_tokens": 3, "n": 2, "temperature": 1.0},
              {"prompt": [9] * 20, "max_tokens": 7, "stream": True}]

    async def go() -> list[int]:
        counts = []
        async with aiohttp.ClientSession() as s:
            for body in bodies[:2]:
                async with s.post(server.url + "/v1/completions", json=body) as r:
                    usage = (await r.json())["usage"]
                    counts.append((usage["prompt_tokens"], usage["completion_tokens"]))
            await post_stream(s, server.url + "/v1/completions", bodies[2])
        return counts

    counts = run(go()) + [(20, 7)]
    after = scrape(server.url)

    def delta(key: str) -> float:
        return after[key] - before.get(key, 0.0)

    assert delta("infbench:prompt_tokens_total" + label) == sum(p for p, _ in counts)
    assert delta("infbench:generation_tokens_total" + label) == sum(c for _, c in counts) == 18
    assert delta(f'infbench:request_success_total{{model_name="{MODEL_NAME}",'
                 'finished_reason="length"}') == 3
    for hist in ("time_to_first_token_seconds", "e2e_request_latency_seconds"):
        assert delta(f"infbench:{hist}_count" + label) == 3
    assert delta("infbench:inter_token_latency_seconds_count" + label) >= 4 + 2 + 6 - 3
    # one step per token of each request (they ran one after another; the n=2 samples share
    # theirs), and the steps' own seconds within the requests' end-to-end seconds
    assert delta("infbench:engine_steps_total" + label) == 5 + 3 + 7
    step_s = delta("infbench:engine_step_seconds_total" + label)
    assert 0 < step_s <= delta("infbench:e2e_request_latency_seconds_sum" + label)
    assert after["infbench:num_requests_running" + label] == 0
    assert after["infbench:kv_cache_usage_perc" + label] == 0
