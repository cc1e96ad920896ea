"""What inspection shows of values and conversations that this process has no classes for:
a model as its fields, a declared conversation from plain data."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

import dflow
from dflow import ContextStack, DFlow
from dflow.errors import SerializationError
from dflow.server.console.views import conversations
from dflow.wire.values import PlainModel, _models, decode, encode


class Order(BaseModel):
    sku: str
    qty: int


def _unregistered(value: BaseModel) -> bytes:
    data = encode(value)
    _models.pop(f"{type(value).__module__}:{type(value).__qualname__}")  # as in a process that lacks it
    return data


def test_a_model_whose_class_is_missing_decodes_as_its_fields_only_when_asked_for_display() -> None:
    data = _unregistered(Order(sku="a-1", qty=3))
    with pytest.raises(SerializationError, match="not registered in this process"):
        decode(data)  # a step never gets a dict in place of its model
    shown = decode(data, plain=True)
    assert isinstance(shown, PlainModel) and shown == {"sku": "a-1", "qty": 3}
    assert shown.model.endswith(":Order") and repr(shown) == "Order(sku='a-1', qty=3)"


def test_a_model_nested_in_data_is_shown_as_its_fields_too() -> None:
    data = encode({"orders": [Order(sku="b", qty=1)]})
    _models.pop(f"{Order.__module__}:{Order.__qualname__}")
    assert decode(data, plain=True) == {"orders": [{"sku": "b", "qty": 1}]}
    dflow.register_model(Order)
    assert decode(data) == {"orders": [Order(sku="b", qty=1)]}  # registered again: rebuilt


def _chat(ctx: ContextStack, question: str) -> str:
    ctx.put("chat/head", [{"role": "user", "content": question}])
    ctx.put(
        "chat/said/0",
        [
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": "c1", "name": "look", "arguments": {"q": question}}],
            }
        ],
    )
    ctx.put(
        "chat/heard/0",
        [{"role": "tool", "name": "look", "tool_call_id": "c1", "content": "line one\nline two"}],
    )
    ctx.put("chat/said/1", [{"role": "assistant", "content": "It is 4."}])
    dflow.declare_conversation(
        ctx, "helper", head=["chat/head"], per_turn=["chat/said/{turn}", "chat/heard/{turn}"]
    )
    return "It is 4."


def test_a_declared_conversation_is_shown_by_the_tree_and_the_console_with_no_view_in_the_process(
    local: dflow.Runtime,
) -> None:
    run = DFlow.direct_run("2+2?", lambda q: DFlow.just(q).map(_chat).id("chat"))
    assert run.result(5) == "It is 4."
    tree = run.tree()
    part = tree[tree.index("conversation helper (4 messages)") :].splitlines()
    assert part == [
        "conversation helper (4 messages)",
        "  user: 2+2?",
        "  assistant: ",
        '    → look(q="2+2?") [c1]',
        "  tool look [c1]: line one",
        "    line two",
        "  assistant: It is 4.",
    ]
    found = conversations(_data(run))
    assert [(c.title, [m["role"] for m in c.messages]) for c in found] == [
        ("helper", ["user", "assistant", "tool", "assistant"])
    ]


def _data(run: dflow.Run) -> dict[str, bytes]:
    return {k: encode(v) for k, v in run.context().as_dict().items()}


def test_a_conversation_is_declared_only_with_keys_that_name_their_turn(local: dflow.Runtime) -> None:
    def bad(ctx: ContextStack, _: object) -> None:
        dflow.declare_conversation(ctx, "c", head=[], per_turn=["chat/said"])

    run = DFlow.direct_run(1, lambda v: DFlow.just(v).map(bad).id("bad"))
    with pytest.raises(dflow.RunFailedError, match=r"each per_turn key names its turn with \{turn\}"):
        run.result(5)
