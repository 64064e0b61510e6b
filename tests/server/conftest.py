"""Fixtures for the server tests: a real `strata serve` (strata_server.py,
shared with tests/web) with the real default model, and clients from the
official openai / anthropic SDKs pointed at it. The test modules import
Server, CTX, httpx and raw_exchange from here."""
import socket

import pytest

from strata_server import BIN, CTX, MODEL, Server, httpx  # noqa: F401 (re-exported to the test modules)


@pytest.fixture(scope="session")
def server():
    s = Server("--slots", "2")
    yield s
    rc = s.stop()
    assert rc == 0, f"strata serve exited with {rc}\n{s.log()[-3000:]}"


@pytest.fixture(scope="session")
def oai(server):
    import openai
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="session")
def anth(server):
    import anthropic
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=60)


def raw_exchange(port, data, timeout=10):
    """Send raw bytes, read until the server closes (or the timeout, or a reset), return what came back."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.sendall(data)
    got = b""
    try:
        while chunk := s.recv(65536):
            got += chunk
    except (socket.timeout, ConnectionResetError):
        pass
    s.close()
    return got
