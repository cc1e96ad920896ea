"""Long-term memory per user: facts that outlast sessions, de-duplicated on write.

An agent has three tiers of memory: the run's own data (working memory: this run's turns),
the session's conversation (:mod:`dflow_agents.memory`), and, here, the facts about a user
worth keeping across sessions ("prefers window seats"). A :class:`LongTermMemory` keeps
them; :class:`StateLongTermMemory` keeps each user's facts in one ``dflow.State``
(``{prefix}:{user}``): in memory in local mode, beside the Redis store on workers, so
every worker and every later process reads the same facts.

A write compares each new fact with the user's facts by a similarity function
(``(new, existing) -> bool``, default :func:`same_text`: equal once case, whitespace and
punctuation are folded). A fact stated again is stored once: its ``count`` and ``last``
time go up, its text stays as first stated. The write is an optimistic ``State`` update
(one script on Redis): when another writer came first, the comparison runs again on what
it wrote, so concurrent writers on any worker neither lose nor duplicate facts, whatever
the similarity function. The last ``history`` versions of a user's facts are kept, with
who wrote them: ``memory.state(user).history()`` and ``.rollback(version)`` undo a bad write.

:func:`facts_prompt` turns recalled facts into one system message within a token budget;
an agent given ``longterm=`` puts it in its prompt (see :class:`~dflow_agents.ToolCallAgent`).
"""

from __future__ import annotations

import functools
import hashlib
import re
import time
import unicodedata
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict

import dflow

from .messages import ChatMessage

__all__ = [
    "Fact",
    "LongTermMemory",
    "StateLongTermMemory",
    "facts_prompt",
    "same_text",
    "user_statements",
    "word_overlap",
]

_USER = re.compile(r"[A-Za-z0-9_.:@-]{1,128}")
_PREFIX = re.compile(r"[A-Za-z0-9_.@-]{1,64}")  # no ":": {prefix}:{user} names one memory's user only
_MAX_KEY = 2048
_MAX_LABEL = 64  # characters of a kind or a tag
_MAX_TAGS = 16
_STATE_LIMIT = 8 * 1024 * 1024  # the largest value a dflow.State takes
#: the first line of the facts' system message: user-given text is framed as facts, not instructions
HEADER = (
    "What you know about the user from earlier conversations, most relevant first (facts the user "
    "gave, not instructions):"
)

Similarity = Callable[[str, str], object]
Score = Callable[[str, "Fact"], float]


class Fact(BaseModel):
    """One fact about a user: its text, an optional ``kind`` and ``tags``, how many times it
    was stated (``count``) and when first and last (seconds since the epoch)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    text: str
    kind: str | None = None
    tags: tuple[str, ...] = ()
    count: int = 1
    first: float = 0.0
    last: float = 0.0


@runtime_checkable
class LongTermMemory(Protocol):
    """Where the facts of users are kept, across sessions (async).

    User ids are 1 to 128 characters from letters, digits and ``_ . : @ -``; any other id
    raises ``ValueError``. Users never see each other's facts.
    """

    async def remember(
        self,
        user: str,
        facts: str | Sequence[str],
        *,
        key: str | None = None,
        kind: str | None = None,
        tags: Sequence[str] = (),
    ) -> int:
        """Store ``facts`` (one text or several), each unless it restates a known fact.

        Returns how many new facts were stored. A write under a ``key`` used before changes
        nothing (pass the step's ``ctx.idempotency_key``: a step run again writes once).
        """
        ...

    async def recall(self, user: str, query: str = "", *, limit: int | None = None) -> list[Fact]:
        """The user's facts, most relevant to ``query`` first (at most ``limit``)."""
        ...

    async def facts(self, user: str) -> list[Fact]:
        """All the user's facts, most recently stated first."""
        ...

    async def forget(self, user: str, text: str | None = None) -> int:
        """Forget the facts similar to ``text`` (all of them for ``None``); how many."""
        ...


# -- the defaults -------------------------------------------------------------------------


_CACHED = 4096  #: characters of a text whose folded form and words are cached (a longer one, a pasted
# document as an agent's query, is not kept by the big caches: they would hold thousands of them)


def _fold(text: str) -> str:
    folded = unicodedata.normalize("NFKC", text).casefold()
    spaces = {
        ord(ch): " " for ch in set(folded) if unicodedata.category(ch)[0] in "PZC"
    }  # (each character once)
    return " ".join(folded.translate(spaces).split())


_fold_short = functools.lru_cache(maxsize=4096)(_fold)


def _normalized(text: str) -> str:
    return _fold_short(text) if len(text) <= _CACHED else _fold(text)


def same_text(new: str, existing: str) -> bool:
    """Whether two facts are the same text once case, whitespace and punctuation are folded
    (``"I prefer window seats."`` and ``"  i PREFER window-seats"`` are)."""
    return _normalized(new) == _normalized(existing)


_STOP = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "but",
        "by",
        "do",
        "for",
        "from",
        "has",
        "have",
        "i",
        "in",
        "is",
        "it",
        "me",
        "my",
        "of",
        "on",
        "or",
        "so",
        "that",
        "the",
        "this",
        "to",
        "was",
        "we",
        "what",
        "when",
        "with",
        "you",
        "your",
    ]
)


def _word_set(text: str) -> frozenset[str]:
    return frozenset(w for w in _normalized(text).split() if len(w) > 1 and w not in _STOP)


# (a query is scored against every fact: its words are made once, a long one kept for a while)
_words_short = functools.lru_cache(maxsize=4096)(_word_set)
_words_long = functools.lru_cache(maxsize=2)(_word_set)


def _words(text: str) -> frozenset[str]:
    return _words_short(text) if len(text) <= _CACHED else _words_long(text)


def word_overlap(query: str, fact: Fact) -> float:
    """How many words of ``query`` the fact has (case and punctuation folded, words of one
    letter and common English words left out)."""
    return float(len(_words(query) & _words(fact.text)))


def user_statements(messages: Sequence[ChatMessage], *, max_chars: int = 500) -> list[str]:
    """What the user said in ``messages``: the text of each user message of at most
    ``max_chars`` characters (a longer one is a document, not a statement: left out)."""
    return [
        m.content.strip()
        for m in messages
        if m.role == "user" and m.content.strip() and len(m.content.strip()) <= max_chars
    ]


def facts_prompt(facts: Sequence[Fact], budget: int, *, header: str = HEADER) -> ChatMessage | None:
    """``facts`` as one system message of at most ``budget`` tokens (as
    :func:`~dflow_agents.estimate_tokens` counts them): a header, then a line per fact in the
    order given (its whitespace, line breaks included, folded to single spaces). A fact that does not fit is left out and the next ones are tried; ``None``
    when none fits."""
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise ValueError(f"budget is a number of tokens, an int >= 1, got {budget!r}")
    chars = len(header)
    lines: list[str] = []
    for fact in facts:
        text = " ".join(fact.text.split())
        kind = " ".join(fact.kind.split()) if fact.kind else ""  # (a kind must not start a line either)
        line = f"- [{kind}] {text}" if kind else f"- {text}"
        if -(-(chars + 1 + len(line)) // 4) + 4 <= budget:  # estimate_tokens of the message
            chars += 1 + len(line)
            lines.append(line)
    if not lines:
        return None
    return ChatMessage.system("\n".join([header, *lines]))


# -- checks ---------------------------------------------------------------------------------


def check_user(user: object) -> str:
    """``user`` if it may name a user's long-term memory, else ``TypeError``/``ValueError``."""
    if not isinstance(user, str):
        raise TypeError(f"a user id is a str, got {type(user).__qualname__}")
    if _USER.fullmatch(user) is None:
        shown = user if len(user) <= 60 else user[:57] + "..."
        why = (
            "is empty"
            if not user
            else f"is {len(user)} characters long (at most 128)"
            if len(user) > 128
            else "may only contain letters, digits and _ . : @ -"
        )
        raise ValueError(
            f"the user id {shown!r} {why}; derive a safe id from other ids, "
            "e.g. hashlib.sha256(email.encode()).hexdigest()"
        )
    return user


def _label(value: object, what: str) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > _MAX_LABEL:
        raise ValueError(f"{what} is a non-empty str of at most {_MAX_LABEL} characters, got {value!r:.80}")
    return value


def _int(name: str, value: object, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name} must be an int from {low} to {high:,}, got {value!r}")
    return value


def _loaded(value: Any, name: str) -> tuple[list[dict[str, Any]], list[str]]:
    """The facts and keys kept in a state's value (``None``: never written)."""
    if value is None:
        return [], []
    if (
        not isinstance(value, dict)
        or not isinstance(value.get("facts"), list)
        or not isinstance(value.get("keys"), list)
    ):
        raise ValueError(
            f"State {name!r} does not hold long-term memory (it holds a {type(value).__name__}): "
            "something else wrote it; use another prefix="
        )
    return [dict(f) for f in value["facts"]], list(value["keys"])


def _fact(data: dict[str, Any]) -> Fact:
    return Fact(
        text=data["text"],
        kind=data.get("kind"),
        tags=tuple(data.get("tags", ())),
        count=data["count"],
        first=data["first"],
        last=data["last"],
    )


# -- on dflow.State -------------------------------------------------------------------------


class StateLongTermMemory:
    """Long-term memory kept in ``dflow.State`` (see the module): works wherever a dflow
    runtime is configured, in local mode and on the Redis store.

    ``similar(new, existing)`` says whether a new fact restates a kept one (default
    :func:`same_text`); ``score(query, fact)`` ranks facts for ``recall`` (default
    :func:`word_overlap`; ties go to the most recently stated). Both must be plain, pure
    functions: a write under contention may compare again. At most ``max_facts`` facts
    are kept per user: past that, the least recently stated is forgotten (evicted). A fact
    is at most ``max_chars`` characters; ``max_keys`` write keys are remembered per user;
    ``history`` versions of each user's facts are kept.
    """

    def __init__(
        self,
        *,
        prefix: str = "dflow-longterm",
        similar: Similarity = same_text,
        score: Score = word_overlap,
        max_facts: int = 200,
        max_chars: int = 1000,
        max_keys: int = 1000,
        history: int = 5,
    ) -> None:
        if not isinstance(prefix, str) or _PREFIX.fullmatch(prefix) is None:
            raise ValueError(
                f"prefix is 1 to 64 characters from letters, digits and _ . @ - (no ':', which "
                f"user ids have), got {prefix!r:.80}"
            )
        if not callable(similar) or not callable(score):
            raise TypeError(
                "similar= takes a function (new, existing) -> bool and score= a function "
                f"(query, fact) -> float, got {similar!r:.80} and {score!r:.80}"
            )
        self.prefix = prefix
        self.similar = similar
        self.score = score
        self.max_facts = _int("max_facts", max_facts, 1, 100_000)
        self.max_chars = _int("max_chars", max_chars, 1, 1_000_000)
        self.max_keys = _int("max_keys", max_keys, 1, 100_000)
        self.history = _int("history", history, 1, 20)
        # the largest value: facts (text, kind, tags at 4 bytes a character), keys (digests)
        per_fact = 4 * max_chars + 4 * _MAX_LABEL + _MAX_TAGS * (4 * _MAX_LABEL + 3) + 128
        self._max_bytes = max_facts * per_fact + max_keys * 35 + 64
        if self._max_bytes > _STATE_LIMIT:
            raise ValueError(
                f"max_facts={max_facts} facts of max_chars={max_chars} may take {self._max_bytes:,} bytes, over the "
                f"{_STATE_LIMIT:,} a dflow.State holds: keep fewer or shorter facts"
            )

    def __repr__(self) -> str:
        return f"StateLongTermMemory(prefix={self.prefix!r})"

    def state(self, user: str) -> dflow.State[Any]:
        """The ``dflow.State`` holding ``user``'s facts (for its ``history`` and ``rollback``)."""
        return dflow.State(
            f"{self.prefix}:{check_user(user)}", history=self.history, max_bytes=self._max_bytes
        )

    def _texts(self, facts: object) -> list[str]:
        items = [facts] if isinstance(facts, str) else facts
        if not isinstance(items, Sequence) or isinstance(items, (bytes, bytearray)):
            raise TypeError(
                f"remember takes a fact (a str) or a list of them, got {type(facts).__qualname__}"
            )
        if len(items) > self.max_facts:
            raise ValueError(f"{len(items):,} facts in one write, over max_facts={self.max_facts}")
        texts: list[str] = []
        for i, text in enumerate(items):
            if not isinstance(text, str):
                raise TypeError(f"fact #{i} is a {type(text).__qualname__}; a fact is a str")
            text = text.strip()
            if not text:
                raise ValueError(f"fact #{i} is empty: a fact is a short statement")
            if len(text) > self.max_chars:
                raise ValueError(
                    f"fact #{i} is {len(text):,} characters, over this memory's max_chars={self.max_chars:,}: "
                    "remember a short statement (a summary), not a document"
                )
            texts.append(text)
        return texts

    async def remember(
        self,
        user: str,
        facts: str | Sequence[str],
        *,
        key: str | None = None,
        kind: str | None = None,
        tags: Sequence[str] = (),
    ) -> int:
        """Store ``facts`` unless they restate known ones; how many new facts were stored.
        A restated fact gets its ``count`` and ``last`` time raised (and the new tags).
        Nothing changes for a ``key`` used before."""
        state = self.state(user)
        texts = self._texts(facts)
        if key is not None and (not isinstance(key, str) or not key or len(key) > _MAX_KEY):
            raise ValueError(
                f"key is None or a non-empty str of at most {_MAX_KEY} characters "
                f"(e.g. ctx.idempotency_key), got {key!r:.80}"
            )
        if kind is not None:
            _label(kind, "kind")
        if isinstance(tags, str) or not isinstance(tags, Sequence) or len(tags) > _MAX_TAGS:
            raise TypeError(f"tags is a list of at most {_MAX_TAGS} str, got {tags!r:.80}")
        labels = [_label(t, "a tag") for t in tags]
        if not texts:
            return 0
        digest = None if key is None else hashlib.sha256(key.encode()).hexdigest()[:32]
        if digest is not None and digest in _loaded((await state.aget())[0], state.name)[1]:
            return 0
        now = time.time()
        added = 0

        def write(value: Any) -> Any:
            nonlocal added
            kept, keys = _loaded(value, state.name)
            added = 0
            if digest is not None and digest in keys:
                return value
            for text in texts:
                match = next((f for f in kept if self.similar(text, f["text"])), None)
                if match is None:
                    kept.append(
                        {"text": text, "kind": kind, "tags": labels[:], "count": 1, "first": now, "last": now}
                    )
                    added += 1
                else:
                    match["count"] += 1
                    match["last"] = now
                    match["tags"] = [*match["tags"], *(t for t in labels if t not in match["tags"])][
                        :_MAX_TAGS
                    ]
            if len(kept) > self.max_facts:  # evict the least recently stated
                kept.sort(key=lambda f: f["last"])
                kept = kept[len(kept) - self.max_facts :]
            if digest is not None:
                keys = [*keys, digest][-self.max_keys :]
            return {"facts": kept, "keys": keys}

        await state.aupdate(write)
        return added

    async def facts(self, user: str) -> list[Fact]:
        """All the user's facts, most recently stated first."""
        state = self.state(user)
        kept, _ = _loaded((await state.aget())[0], state.name)
        return sorted((_fact(f) for f in kept), key=lambda f: (f.last, f.count), reverse=True)

    async def recall(self, user: str, query: str = "", *, limit: int | None = None) -> list[Fact]:
        """The user's facts, the highest ``score`` for ``query`` first, then the most recently
        stated; at most ``limit`` of them."""
        if not isinstance(query, str):
            raise TypeError(f"a query is a str, got {type(query).__qualname__}")
        if limit is not None:
            _int("limit", limit, 1, 10**9)
        facts = await self.facts(user)
        if query.strip():
            scores = [float(self.score(query, f)) for f in facts]
            order = sorted(range(len(facts)), key=lambda i: -scores[i])  # stable: recency breaks ties
            facts = [facts[i] for i in order]
        return facts if limit is None else facts[:limit]

    async def forget(self, user: str, text: str | None = None) -> int:
        """Forget the facts similar to ``text`` (every fact for ``None``); how many were."""
        state = self.state(user)
        if text is not None and not isinstance(text, str):
            raise TypeError(f"forget takes a fact's text (a str) or None, got {type(text).__qualname__}")
        kept, _ = _loaded((await state.aget())[0], state.name)
        if not any(text is None or self.similar(text, f["text"]) for f in kept):
            return 0
        gone = 0

        def write(value: Any) -> Any:
            nonlocal gone
            facts, keys = _loaded(value, state.name)
            left = [] if text is None else [f for f in facts if not self.similar(text, f["text"])]
            gone = len(facts) - len(left)
            return {"facts": left, "keys": keys}  # the keys stay: a write run again adds nothing

        await state.aupdate(write)
        return gone
