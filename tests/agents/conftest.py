"""Agent tests never reach a network model: the switch is on for every test here, and the
OpenAI-compatible client is tested against a local HTTP server the test starts; ``shop``
serves the shop of ``site.py``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dflow_agents.testing import block_network_models
from tests.support.fake_llm import Answer as Answer
from tests.support.fake_llm import FakeLLMServer as FakeLLMServer
from tests.support.fake_llm import Received as Received
from tests.support.fake_llm import chat_body as chat_body
from tests.support.fake_llm import serving

from . import site as S


@pytest.fixture
def shop() -> Iterator[S.Site]:
    """The shop of ``site.py``, served on 127.0.0.1 for one test."""
    with S.Site(S.shop()) as site:
        yield site


@pytest.fixture(autouse=True)
def _no_network_models(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("DFLOW_AGENTS_BLOCK_NETWORK", "1")
    with block_network_models():
        yield


@pytest.fixture
def llm_server() -> Iterator[FakeLLMServer]:
    """A fake OpenAI-compatible server (``tests.support.fake_llm``); ``base_url`` ends in ``/v1``."""
    with serving() as fake:
        yield fake
