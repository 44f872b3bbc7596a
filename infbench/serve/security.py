"""Who may talk to the server: the API key, the Host check, and errors as OpenAI objects.

- `--api-key KEY` (or INFBENCH_API_KEY): every route but /health and /metrics needs
  `Authorization: Bearer KEY` (those two as well with `--protect-health-metrics`), compared
  in constant time (hmac.compare_digest); a missing or wrong key is a 401.
- The Host header must name this server: a loopback name or address, the `--host` bound,
  any IP address when bound to all interfaces, or a name in `--allowed-hosts` (a proxy's
  public name; `*` turns the check off).  A page on another site that points its DNS name
  at 127.0.0.1 (DNS rebinding) sends its own name as Host and is refused (400).
- Binding an address other than loopback without a key is refused at start unless
  `--allow-unauthenticated` says it is meant.
- Every error the HTTP layer or a route raises (404, 405, 413, ...) is answered as an
  OpenAI error object, and the Server header says `infbench` without versions.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from infbench.core.errors import UserError
from infbench.serve.protocol import ApiError

SERVER_NAME = "infbench"
API_KEY_ENV = "INFBENCH_API_KEY"
OPEN_PATHS = frozenset({"/health", "/metrics"})  # open without --protect-health-metrics
LOG = logging.getLogger("infbench.serve")
_WILDCARDS = {"0.0.0.0", "::", ""}
_LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Security:
    """One server's access rules (see the module docstring)."""

    host: str = "127.0.0.1"  # the --host bound
    api_key: str | None = None
    protect_health_metrics: bool = False
    allowed_hosts: tuple[str, ...] = ()  # extra Host names; ("*",): any
    _allowed: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        names = {normalize_host(h) for h in self.allowed_hosts} | _LOOPBACK_NAMES
        names.add(normalize_host(self.host))
        object.__setattr__(self, "_allowed", frozenset(names))

    def host_allowed(self, header: str | None) -> bool:
        if header is None or "*" in self.allowed_hosts:
            return True  # HTTP/1.0 without Host: no browser sends that
        name = normalize_host(_strip_port(header))
        if name in self._allowed:
            return True
        try:
            address = ipaddress.ip_address(name)
        except ValueError:
            return False  # a DNS name nobody allowed
        return address.is_loopback or self.host in _WILDCARDS

    def key_matches(self, header: str | None) -> bool:
        if self.api_key is None:
            return True
        scheme, _, token = (header or "").partition(" ")
        expected = self.api_key.encode()
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(),
                                                                  expected)


def normalize_host(name: str) -> str:
    return name.strip().lower().rstrip(".").removeprefix("[").removesuffix("]")


def _strip_port(header: str) -> str:
    header = header.strip()
    if header.startswith("["):  # [::1]:8000
        return header[1:header.find("]")] if "]" in header else header
    if header.count(":") == 1:
        return header.split(":", 1)[0]
    return header  # a bare IPv6 address, or no port


def is_loopback(host: str) -> bool:
    """True when every address `host` names is a loopback one (resolving a name)."""
    name = normalize_host(host)
    if name in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(name, None)
    except OSError:
        return False  # cannot resolve: the bind fails later with its own message
    return bool(infos) and all(ipaddress.ip_address(str(i[4][0]).split("%")[0]).is_loopback
                               for i in infos)


def check_bind(host: str, api_key: str | None, allow_unauthenticated: bool) -> None:
    """Refuse to listen beyond loopback without a key (unless asked to)."""
    if api_key is None and not allow_unauthenticated and not is_loopback(host):
        raise UserError(f"--host {host}: listening beyond loopback without --api-key (or "
                        f"{API_KEY_ENV}) lets anyone who can reach it run generations; give "
                        "a key, or --allow-unauthenticated if that is meant")


def error_response(exc: ApiError, *, close: bool = False) -> web.Response:
    """`exc` as its status and an OpenAI error object."""
    headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
    resp = web.json_response(exc.body(), status=exc.status, headers=headers)
    if close:
        resp.force_close()  # an unread body is not drained: the connection is dropped
    return resp


_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large",
               408: "request_timeout", 415: "unsupported_media_type"}


def middlewares(security: Security) -> list[Any]:
    """The middlewares of an app: errors as JSON (outermost), then Host, key, content."""

    @web.middleware
    async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except ApiError as exc:
            LOG.info("%s %s: %d %s", request.method, request.path[:100], exc.status,
                     exc.message[:200])
            return error_response(exc, close=exc.status in (408, 413, 415))
        except web.HTTPException as exc:
            if exc.status < 400:
                raise  # a redirect is not an error
            message = exc.text if exc.text and not exc.text.startswith(str(exc.status)) \
                else f"{exc.reason}: {request.method} {request.path[:100]}"
            LOG.info("%s %s: %d %s", request.method, request.path[:100], exc.status, exc.reason)
            return error_response(ApiError(message, status=exc.status,
                                           code=_HTTP_CODES.get(exc.status)),
                                  close=exc.status >= 413)
        except ConnectionError:
            raise  # the client went away mid-answer: aiohttp drops the connection quietly
        except Exception as exc:  # a bug: logged with its traceback, answered as JSON
            LOG.exception("internal error handling %s %s", request.method, request.path[:100])
            return error_response(ApiError(f"internal server error: {type(exc).__name__}",
                                           status=500, type_="server_error"))

    @web.middleware
    async def access(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not security.host_allowed(request.headers.get("Host")):
            raise ApiError(f"the Host header {request.headers['Host'][:100]!r} does not name "
                           "this server (see --allowed-hosts)", code="host_not_allowed")
        if (request.path not in OPEN_PATHS or security.protect_health_metrics) and \
                not security.key_matches(request.headers.get("Authorization")):
            raise ApiError("a valid API key is required: Authorization: Bearer KEY",
                           status=401, code="invalid_api_key")
        return await handler(request)

    return [errors, access]


async def _server_header(_request: web.Request, response: web.StreamResponse) -> None:
    response.headers["Server"] = SERVER_NAME


def secure_app(app: web.Application, security: Security) -> None:
    """Install the middlewares and the Server header on `app` (before it starts)."""
    app.middlewares.extend(middlewares(security))
    app.on_response_prepare.append(_server_header)
