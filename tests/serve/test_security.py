"""Access to the server: the API key (routes it guards, wrong and missing keys, the flag
that guards /health and /metrics too), the Host allowlist, and the refusal to listen
beyond loopback without a key."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import aiohttp
import openai
import pytest
from cli_helpers import run_args
from serve_helpers import MODEL_NAME, RunningServer, start_server

from infbench.core.errors import UserError
from infbench.serve.security import Security, check_bind, is_loopback

KEY = "sk-test-0123456789"


@pytest.fixture(scope="module")
def keyed() -> Iterator[RunningServer]:
    srv = start_server(security=Security(api_key=KEY))
    yield srv
    srv.stop()


async def _status(url: str, path: str, headers: dict[str, str] | None = None,
                  body: Any = None) -> tuple[int, Any, str]:
    async with aiohttp.ClientSession() as s:
        method = s.post if body is not None else s.get
        async with method(url + path, json=body, headers=headers) as r:
            text = await r.text()
            return r.status, r.headers.get("WWW-Authenticate"), text


@pytest.mark.parametrize("headers", [None, {"Authorization": "Bearer wrong"},
                                     {"Authorization": KEY}, {"Authorization": f"Basic {KEY}"},
                                     {"Authorization": f"Bearer {KEY}x"}],
                         ids=["missing", "wrong", "no-scheme", "basic", "longer"])
def test_the_api_needs_the_key(keyed: RunningServer, headers: dict[str, str] | None) -> None:
    for path, body in (("/v1/models", None), ("/v1/completions", {"prompt": [1]}),
                       ("/v1/chat/completions", {"messages": []}), ("/v2/unknown", None)):
        status, challenge, text = asyncio.run(_status(keyed.url, path, headers, body))
        assert status == 401 and challenge == "Bearer", (path, text)
        assert '"code": "invalid_api_key"' in text


def test_the_key_opens_the_api_and_health_metrics_stay_open(keyed: RunningServer) -> None:
    good = {"Authorization": f"bearer {KEY}"}  # the scheme is case-insensitive
    assert asyncio.run(_status(keyed.url, "/v1/models", good))[0] == 200
    assert asyncio.run(_status(keyed.url, "/health"))[0] == 200
    assert asyncio.run(_status(keyed.url, "/metrics"))[0] == 200
    client = openai.OpenAI(base_url=keyed.url + "/v1", api_key=KEY, max_retries=0)
    out = client.completions.create(model=MODEL_NAME, prompt="hi", max_tokens=2)
    assert out.usage is not None and out.usage.completion_tokens == 2
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=keyed.url + "/v1", api_key="nope",
                      max_retries=0).models.list()


def test_protect_health_metrics_guards_every_route() -> None:
    srv = start_server(security=Security(api_key=KEY, protect_health_metrics=True))
    try:
        for path in ("/health", "/metrics"):
            assert asyncio.run(_status(srv.url, path))[0] == 401
            assert asyncio.run(_status(srv.url, path,
                                       {"Authorization": f"Bearer {KEY}"}))[0] == 200
    finally:
        srv.stop()


@pytest.mark.parametrize(("security", "host", "allowed"), [
    (Security(), "localhost:1", True),
    (Security(), "api.example.com", False),
    (Security(allowed_hosts=("api.example.com",)), "API.example.com:443", True),
    (Security(allowed_hosts=("api.example.com",)), "other.example.com", False),
    (Security(allowed_hosts=("*",)), "anything.example", True),
    (Security(host="0.0.0.0", api_key=KEY), "192.168.1.20:8000", True),  # any address
    (Security(host="0.0.0.0", api_key=KEY), "rebind.example", False),  # but no names
    (Security(host="10.1.2.3", api_key=KEY), "10.1.2.3:8000", True),
    (Security(host="10.1.2.3", api_key=KEY), "10.1.2.4", False),
    (Security(host="myhost.internal", api_key=KEY), "myhost.internal:8000", True),
    (Security(), None, True),  # HTTP/1.0 without Host: no browser sends that
])
def test_host_allowlist(security: Security, host: str | None, allowed: bool) -> None:
    assert security.host_allowed(host) is allowed


def test_listening_beyond_loopback_needs_a_key_or_the_flag() -> None:
    for host in ("127.0.0.1", "localhost", "::1", "127.5.5.5"):
        assert is_loopback(host)
        check_bind(host, None, False)
    for host in ("0.0.0.0", "::", "10.0.0.1"):
        assert not is_loopback(host)
        with pytest.raises(UserError, match="--allow-unauthenticated"):
            check_bind(host, None, False)
        check_bind(host, KEY, False)
        check_bind(host, None, True)


def test_serve_refuses_a_public_host_without_a_key(capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("INFBENCH_API_KEY", raising=False)
    code, out, err = run_args(["serve", "--model", "tiny", "--host", "0.0.0.0"], capsys)
    assert code == 2 and out == ""
    assert err.strip().startswith("error: --host 0.0.0.0: listening beyond loopback")
    monkeypatch.setenv("INFBENCH_API_KEY", " ")
    code, _, err = run_args(["serve", "--model", "tiny"], capsys)
    assert code == 2 and "--api-key (or INFBENCH_API_KEY): must not be empty" in err
