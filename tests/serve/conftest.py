"""The module-scoped server of the server tests (tests/serve_helpers.py builds it)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from serve_helpers import RunningServer, start_server


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    srv = start_server()
    yield srv
    srv.stop()
