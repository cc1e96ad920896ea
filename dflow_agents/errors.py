"""Every error the LLM layer raises, in one tree under ``dflow.DFlowError``.

::

    ModelError                      a model request failed (carries ``endpoint``)
    ├── ModelConfigError            no base URL / API key / model name (also a ValueError)
    ├── ModelRequestBlockedError    the network switch refused a non-loopback request
    ├── ModelStatusError            the server refused the request (400, 401, 404, ...)
    ├── ModelResponseError          the server answered with a body we cannot use
    └── ModelRetryableError         worth retrying later: put it in ``.retry(on=...)``
        ├── ModelRateLimitError     HTTP 429 (carries ``retry_after`` when the server sent one)
        ├── ModelTimeoutError       the request timed out (also a TimeoutError)
        ├── ModelConnectionError    the server could not be reached, or dropped the connection
        ├── ModelServerError        HTTP 5xx, 409 or a gateway error
        └── ModelFallbackError      every model of a ModelFallback failed or was skipped

The client never sleeps or retries by itself: a dflow step that calls a model declares
``.retry(5, backoff=2.0, on=ModelRetryableError)`` and the wait is a store timer.

No message here ever contains an API key: the OpenAI client scrubs it from what the server
sent back before raising.
"""

from __future__ import annotations

import dflow

__all__ = [
    "ModelConfigError",
    "ModelConnectionError",
    "ModelError",
    "ModelRateLimitError",
    "ModelRequestBlockedError",
    "ModelResponseError",
    "ModelRetryableError",
    "ModelServerError",
    "ModelStatusError",
    "ModelTimeoutError",
]


class ModelError(dflow.DFlowError):
    """Root of the LLM layer's errors; ``endpoint`` is the base URL asked, when known."""

    def __init__(self, message: str, *, endpoint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.endpoint = endpoint

    def __reduce__(self) -> tuple[object, ...]:
        # Keyword-only arguments do not survive the default exception pickling.
        return (_rebuild, (type(self), self.message, dict(self.__dict__)))


def _rebuild(cls: type[ModelError], message: str, state: dict[str, object]) -> ModelError:
    err = cls.__new__(cls)
    Exception.__init__(err, message)
    err.__dict__.update(state)
    return err


class ModelConfigError(ModelError, ValueError):
    """A model cannot be built: a base URL, an API key or a model name is missing or wrong."""


class ModelRequestBlockedError(ModelError):
    """The network switch is on (tests) and the request would have left this machine."""


class ModelStatusError(ModelError):
    """The server refused the request with an HTTP status that retrying will not fix."""

    def __init__(self, message: str, *, endpoint: str | None = None, status_code: int) -> None:
        super().__init__(message, endpoint=endpoint)
        self.status_code = status_code


class ModelResponseError(ModelError):
    """The server answered, but the body is not a chat/completion response we can read."""


class ModelRetryableError(ModelError):
    """A failure that may pass by itself: retry the step later (a dflow retry policy)."""


class ModelRateLimitError(ModelRetryableError):
    """HTTP 429. ``retry_after`` is the wait in seconds the server asked for, or ``None``."""

    def __init__(
        self, message: str, *, endpoint: str | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message, endpoint=endpoint)
        self.retry_after = retry_after


class ModelTimeoutError(ModelRetryableError, TimeoutError):
    """The request took longer than the client's timeout."""


class ModelConnectionError(ModelRetryableError):
    """The server could not be reached (refused, DNS, TLS), or the connection dropped before
    its answer was complete (closed or reset mid-answer: the message says which)."""


class ModelServerError(ModelRetryableError):
    """The server failed (HTTP 5xx, 409, a gateway error); ``retry_after`` as for 429."""

    def __init__(
        self,
        message: str,
        *,
        endpoint: str | None = None,
        status_code: int,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message, endpoint=endpoint)
        self.status_code = status_code
        self.retry_after = retry_after
