"""A headless Chromium driven over the DevTools protocol (aiohttp's websocket client).

`open_page(path)` starts Chromium (the Debian package's `chromium`) with a fresh profile, opens
`file://path`, waits for the load event and for every figure to be drawn, and returns what
the tests assert on: console errors and uncaught exceptions, every network request (a
self-contained report makes none beyond its own file), the sections present, and per
figure whether plotly drew it (an SVG with plotted marks) — plus a PNG screenshot on request.
Tests skip (with the reason) where no chromium is installed; `.ci/run` installs it.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
PAGE_TIMEOUT_S = 60.0


def chromium_path() -> str | None:
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


@dataclass
class PageReport:
    console_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    sections: list[str] = field(default_factory=list)
    figures: dict[str, dict[str, Any]] = field(default_factory=dict)
    title: str = ""
    screenshot: bytes | None = None
    noscript_text: str = ""


# What the page reports once drawn: each figure's marks (points, lines, bars) and size.
_PROBE = """
(() => {
  const figs = {};
  document.querySelectorAll('[data-figure]').forEach(el => {
    const svg = el.querySelector('svg.main-svg');
    const marks = el.querySelectorAll(
      'g.trace path.point, g.trace path.js-line, g.trace.bars g.point path, g.trace path.js-fill');
    const box = el.getBoundingClientRect();
    figs[el.id] = {drawn: el.classList.contains('js-plotly-plot') && !!svg,
                   marks: marks.length, width: box.width, height: box.height,
                   canvas: el.querySelectorAll('canvas').length};
  });
  return JSON.stringify({
    title: document.title,
    sections: Array.from(document.querySelectorAll('section[data-section]')).map(s => s.id),
    figures: figs});
})()
"""


class _Cdp:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.next_id = 0
        self.pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.events: list[dict[str, Any]] = []
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for msg in self.ws:
            data = json.loads(msg.data)
            if "id" in data and data["id"] in self.pending:
                self.pending.pop(data["id"]).set_result(data)
            else:
                self.events.append(data)

    async def send(self, method: str, params: dict[str, Any] | None = None,
                   session: str | None = None) -> dict[str, Any]:
        self.next_id += 1
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.pending[self.next_id] = fut
        msg: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        await self.ws.send_str(json.dumps(msg))
        reply = await asyncio.wait_for(fut, PAGE_TIMEOUT_S)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return dict(reply.get("result") or {})

    async def wait_event(self, method: str, timeout: float = PAGE_TIMEOUT_S) -> dict[str, Any]:
        deadline = asyncio.get_running_loop().time() + timeout
        seen = 0
        while asyncio.get_running_loop().time() < deadline:
            for event in self.events[seen:]:
                if event.get("method") == method:
                    return event
            seen = len(self.events)
            await asyncio.sleep(0.05)
        raise TimeoutError(f"no {method} within {timeout:.0f} s")


def _start(binary: str, profile: str) -> tuple[subprocess.Popen[str], str]:
    args = [binary, "--headless=new", "--remote-debugging-port=0", f"--user-data-dir={profile}",
            "--no-first-run", "--no-default-browser-check", "--disable-gpu",
            "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--disable-extensions", "--mute-audio",
            "--allow-file-access-from-files", "about:blank"]
    if os.geteuid() == 0:  # CI runs as root; Chromium refuses its sandbox there
        args.insert(1, "--no-sandbox")
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:  # "DevTools listening on ws://127.0.0.1:PORT/devtools/browser/ID"
        found = re.search(r"DevTools listening on (ws://\S+)", line)
        if found:  # keep draining stderr: a full pipe would stall the browser
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            return proc, found.group(1)
    proc.kill()
    raise RuntimeError(f"{binary} exited ({proc.wait()}) without a DevTools endpoint")


async def _open(binary: str, paths: list[Path], screenshot: bool, javascript: bool,
                width: int) -> list[PageReport]:
    profile = tempfile.mkdtemp(prefix="infbench-chromium-")
    proc, url = _start(binary, profile)
    try:
        async with aiohttp.ClientSession() as http, http.ws_connect(
                url, max_msg_size=0) as ws:
            cdp = _Cdp(ws)
            reports = [await _visit(cdp, path, screenshot, javascript, width)
                       for path in paths]
            cdp.reader.cancel()
            return reports
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(profile, ignore_errors=True)


async def _visit(cdp: _Cdp, path: Path, screenshot: bool, javascript: bool,
                 width: int) -> PageReport:
    """One page in a new tab: load, wait for the figures, probe, collect the events."""
    report = PageReport()
    target = await cdp.send("Target.createTarget", {"url": "about:blank"})
    attached = await cdp.send("Target.attachToTarget",
                              {"targetId": target["targetId"], "flatten": True})
    s = attached["sessionId"]
    for domain in ("Page", "Runtime", "Network", "Log"):
        await cdp.send(f"{domain}.enable", session=s)
    await cdp.send("Emulation.setDeviceMetricsOverride",
                   {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False},
                   session=s)
    if not javascript:
        await cdp.send("Emulation.setScriptExecutionDisabled", {"value": True}, session=s)
    cdp.events.clear()
    await cdp.send("Page.navigate", {"url": path.resolve().as_uri()}, session=s)
    await cdp.wait_event("Page.loadEventFired")
    if javascript:
        probe: dict[str, Any] = {}
        for _ in range(int(PAGE_TIMEOUT_S / 0.2)):  # plotly draws after the load event
            value = await cdp.send("Runtime.evaluate",
                                   {"expression": _PROBE, "returnByValue": True}, session=s)
            probe = json.loads(value["result"]["value"])
            if all(f["drawn"] for f in probe["figures"].values()):
                break
            await asyncio.sleep(0.2)
        await asyncio.sleep(0.3)  # late console messages
        report.title = probe["title"]
        report.sections = probe["sections"]
        report.figures = probe["figures"]
    else:  # scripts off: the DOM as parsed, read through the protocol
        doc = await cdp.send("DOM.getDocument", {"depth": -1}, session=s)
        outer = await cdp.send("DOM.getOuterHTML", {"nodeId": doc["root"]["nodeId"]},
                               session=s)
        report.noscript_text = str(outer.get("outerHTML", ""))
    if screenshot:
        shot = await cdp.send("Page.captureScreenshot",
                              {"format": "png", "captureBeyondViewport": True}, session=s)
        report.screenshot = base64.b64decode(shot["data"])
    for event in cdp.events:
        if event.get("sessionId") not in (None, s):
            continue
        method, params = event.get("method"), event.get("params") or {}
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            report.console_errors.append(" ".join(
                str(a.get("value", a.get("description", ""))) for a in params["args"]))
        elif method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails") or {}
            report.console_errors.append(str(
                (details.get("exception") or {}).get("description") or details.get("text")))
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            report.console_errors.append(str(params["entry"].get("text")))
        elif method == "Network.requestWillBeSent":
            report.requests.append(str(params["request"]["url"]))
    await cdp.send("Target.closeTarget", {"targetId": target["targetId"]})
    return report


def open_pages(paths: list[Path], *, screenshot: bool = False, javascript: bool = True,
               width: int = 1280) -> list[PageReport]:
    """Open each page in its own tab of one headless Chromium (see the module docstring)."""
    binary = chromium_path()
    if binary is None:
        raise RuntimeError("no chromium on PATH")
    return asyncio.run(_open(binary, paths, screenshot, javascript, width))
