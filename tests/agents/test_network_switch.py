"""The switch that refuses model requests leaving this machine."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

from dflow_agents import ChatMessage, ModelConnectionError, ModelRequestBlockedError, OpenAIChatModel
from dflow_agents.testing import block_network_models, network_models_blocked

from .conftest import FakeLLMServer, chat_body

ENV = "DFLOW_AGENTS_BLOCK_NETWORK"
FAR_AWAY = "https://api.example.invalid/v1"


@pytest.fixture
def lookups(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every DNS lookup and socket connect made during the test (none reach the network)."""
    seen: list[Any] = []
    real_connect = socket.socket.connect

    def fake_getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(("dns", host.decode() if isinstance(host, bytes) else host))
        raise socket.gaierror(socket.EAI_NONAME, "no DNS in tests")

    def recording_connect(self: socket.socket, address: Any) -> Any:
        seen.append(("connect", address))
        return real_connect(self, address)

    monkeypatch.setattr(socket, "getaddrinfo", fake_getaddrinfo)
    monkeypatch.setattr(socket.socket, "connect", recording_connect)
    return seen


def ask(base_url: str, mode: str = "chat") -> str:
    async def main() -> str:
        async with OpenAIChatModel("m", base_url=base_url, api_key="sk-test", mode=mode) as model:  # type: ignore[arg-type]
            return (await model.chat([ChatMessage.user("hi")])).content

    return asyncio.run(main())


@pytest.mark.parametrize("mode", ["chat", "raw"])
def test_non_loopback_is_refused_before_any_connection(lookups: list[Any], mode: str) -> None:
    assert network_models_blocked()
    with pytest.raises(ModelRequestBlockedError) as caught:
        ask(FAR_AWAY, mode)
    assert lookups == []
    message = str(caught.value)
    assert "api.example.invalid" in message and ENV in message and "ScriptedModel" in message


def test_the_environment_variable_alone_blocks(monkeypatch: pytest.MonkeyPatch, lookups: list[Any]) -> None:
    with block_network_models(False):
        monkeypatch.setenv(ENV, "1")
        assert network_models_blocked()
        with pytest.raises(ModelRequestBlockedError):
            ask(FAR_AWAY)
        monkeypatch.setenv(ENV, "0")
        assert not network_models_blocked()
    assert lookups == []


def test_switched_off_the_request_goes_out(monkeypatch: pytest.MonkeyPatch, lookups: list[Any]) -> None:
    monkeypatch.delenv(ENV)
    with block_network_models(False):
        assert not network_models_blocked()
        with pytest.raises(ModelConnectionError):  # the patched DNS fails it: proof it was attempted
            ask(FAR_AWAY)
    assert ("dns", "api.example.invalid") in lookups
    assert network_models_blocked()  # the with block restored the switch


def test_loopback_hosts_stay_allowed(llm_server: FakeLLMServer) -> None:
    port = llm_server.base_url.split(":")[2].split("/")[0]
    llm_server.answer(chat_body({"content": "via 127.0.0.1"}))
    assert ask(llm_server.base_url) == "via 127.0.0.1"
    llm_server.answer(chat_body({"content": "via localhost"}))
    assert ask(f"http://localhost:{port}/v1") == "via localhost"
    with socket.socket() as s:  # nothing listens on a freed port: refused, but not blocked
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    for url in (f"http://127.0.0.2:{free}/v1", f"http://[::1]:{free}/v1"):
        with pytest.raises(ModelConnectionError):
            ask(url)
