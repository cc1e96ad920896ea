"""A fake OpenAI-compatible server on 127.0.0.1 that plays queued answers in order: JSON
bodies, bodies dropped before or mid-reply, and streamed answers (chunked SSE ``data:``
lines ending with ``data: [DONE]``, held or dropped mid-stream). Agent tests use it through
the ``llm_server`` fixture; integration tests start one for their worker processes."""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Received:
    """One request the fake server got."""

    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class Answer:
    status: int
    body: bytes
    headers: dict[str, str]
    delay: float
    drop: str | None = None  # "before-reply": close unanswered; "mid-body": close halfway through
    chunks: list[bytes] | None = None  # a streamed answer: SSE events, sent one by one (chunked)
    hold_after: int | None = None  # a stream waits after this many chunks, until ``FakeLLMServer.go``
    drop_after: int | None = None  # a stream closes after this many chunks, unfinished
    repeat: bool = False  # it answers every request from now on (it stays queued)


@dataclass
class FakeLLMServer:
    """An OpenAI-compatible server on 127.0.0.1 that plays queued answers in order."""

    base_url: str = ""
    received: list[Received] = field(default_factory=list)
    answers: deque[Answer] = field(default_factory=deque)
    release: threading.Event = field(default_factory=threading.Event)
    go: threading.Event = field(default_factory=threading.Event)  # (a held stream goes on)

    def answer(
        self,
        body: Any,
        *,
        status: int = 200,
        headers: dict[str, str] | None = None,
        delay: float = 0.0,
        drop: str | None = None,
    ) -> None:
        """Queue an answer: a JSON-able body, or bytes sent as they are; ``drop`` closes the
        connection before any reply (``"before-reply"``) or halfway through the body
        (``"mid-body"``), as a server that crashes does."""
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.answers.append(Answer(status, raw, headers or {}, delay, drop))

    def stream(
        self,
        chunks: list[Any],
        *,
        done: bool = True,
        hold_after: int | None = None,
        drop_after: int | None = None,
        repeat: bool = False,
    ) -> None:
        """Queue a streamed answer: each chunk (a JSON-able object, or bytes sent as they
        are) as one ``data: ...`` event of a chunked ``text/event-stream`` response, then
        ``data: [DONE]`` (unless ``done`` is False). ``hold_after``: after that many chunks
        it waits for ``go`` to be set; ``drop_after``: after that many it closes the
        connection mid-stream, as a server that crashes does. ``repeat``: it answers every
        request from its turn on (for a test where a step may run again more than once)."""
        events = [c if isinstance(c, bytes) else b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks]
        if done:
            events.append(b"data: [DONE]\n\n")
        self.answers.append(Answer(200, b"", {}, 0.0, None, events, hold_after, drop_after, repeat))


def chat_body(
    message: dict[str, Any], *, finish: str = "stop", usage: tuple[int, int] = (12, 5)
) -> dict[str, Any]:
    """A chat-completions body shaped like a real server's, around one assistant ``message``."""
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "qwen-plus-2025",
        "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}],
        "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)},
    }


def _handler(server: FakeLLMServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            size = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(size)
            try:
                body: Any = json.loads(raw)
            except ValueError:
                body = raw
            server.received.append(Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body))
            answer = (
                (server.answers[0] if server.answers[0].repeat else server.answers.popleft())
                if server.answers
                else Answer(500, b'{"error": {"message": "the test queued no answer"}}', {}, 0.0)
            )
            if answer.delay:
                server.release.wait(answer.delay)
            if answer.drop == "before-reply":
                return  # HTTP/1.0: the connection closes with nothing said
            if answer.chunks is not None:
                self._stream(answer)
                return
            try:
                self.send_response(answer.status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(answer.body)))
                for k, v in answer.headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(
                    answer.body[: len(answer.body) // 2] if answer.drop == "mid-body" else answer.body
                )
            except OSError:  # the client gave up (a timeout test)
                pass

        def _stream(self, answer: Answer) -> None:
            assert answer.chunks is not None
            self.protocol_version = "HTTP/1.1"  # (chunked transfer encoding, as real servers stream)
            self.close_connection = True
            try:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                for n, event in enumerate(answer.chunks):
                    if answer.drop_after is not None and n >= answer.drop_after:
                        self.wfile.flush()
                        return  # closed mid-stream: no terminating chunk
                    if answer.hold_after is not None and n == answer.hold_after:
                        server.go.wait(30)
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
            except OSError:
                pass

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@contextmanager
def serving() -> Iterator[FakeLLMServer]:
    """A fake OpenAI-compatible server for the block; ``base_url`` ends in ``/v1``."""
    fake = FakeLLMServer()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    fake.base_url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    try:
        yield fake
    finally:
        fake.release.set()
        fake.go.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)
