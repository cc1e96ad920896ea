"""Flows that travel between workers: signed blobs, static references, shared objects."""

from __future__ import annotations

import hashlib
import hmac
import pickle
import threading

import pytest

import dflow
from dflow import BuildError, DFlow, PayloadRejectedError, UnknownStepError
from dflow._durable import ChainCodec
from dflow.flow import compile_flow

static = DFlow.from_call("durable-entry").map(lambda x: x).id("a").init("durable-static")


class Client:
    """Stands for an HTTP client: holds a lock, so it cannot be pickled."""

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def get(self, x: int) -> int:
        return x + 1


def test_static_chains_travel_by_reference() -> None:
    codec = ChainCodec("s")
    ref, blob = codec.ref(static._chain)
    assert ref == "p:durable-entry>a" and blob is None
    assert ChainCodec("s").cached(ref) is static._chain
    with pytest.raises(UnknownStepError, match="does not import the module"):
        ChainCodec("s").cached("p:nobody>has>this")


def test_chains_built_at_run_time_travel_signed() -> None:
    offset = 5
    chain = compile_flow(DFlow.just(1).map(lambda v: v + offset).id("add"))
    ref, blob = ChainCodec("secret").ref(chain)
    assert ref.startswith("h:") and blob is not None
    loaded = ChainCodec("secret").load(ref, blob)
    assert loaded.keys == chain.keys
    assert loaded.nodes[1]._fn(1) == 6, "the captured value travelled with the chain"
    tampered = blob[:-3] + bytes([blob[-3] ^ 1]) + blob[-2:]
    with pytest.raises(PayloadRejectedError, match="signature"):
        ChainCodec("secret").load(ref, tampered)
    with pytest.raises(PayloadRejectedError, match="another DFLOW_SECRET"):
        ChainCodec("other-secret").load(ref, blob)
    with pytest.raises(PayloadRejectedError, match="missing"):
        ChainCodec("secret").load(ref, None)


def test_branches_of_a_chain_built_at_run_time_travel_inside_its_blob() -> None:
    offset = 10
    inner = DFlow.zip([DFlow.just(i).map(lambda v: v + offset).id("b") for i in range(3)]).id("z")
    zipped = compile_flow(inner)
    codec = ChainCodec("secret")
    ref, blob = codec.ref(zipped)
    assert blob is not None
    branch = compile_flow(inner._branches[2])
    assert codec.ref(branch) == (f"{ref}/0.2", blob), "a branch travels in its parent's blob"
    fresh = ChainCodec("secret")
    assert fresh.cached(f"{ref}/0.2") is None
    loaded = fresh.load(f"{ref}/0.2", blob)  # given the parent's blob
    assert loaded.keys == branch.keys and loaded.nodes[1]._fn(2) == 12
    assert fresh.cached(f"{ref}/0.1") is not None, "its sibling came with the same blob"
    assert codec.blob_of(f"{ref}/0.2") == ref
    with pytest.raises(PayloadRejectedError, match="no branch"):
        ChainCodec("secret").load(f"{ref}/5.0", blob)
    tampered = blob[:-3] + bytes([blob[-3] ^ 1]) + blob[-2:]
    with pytest.raises(PayloadRejectedError, match="signature"):
        ChainCodec("secret").load(f"{ref}/0.2", tampered)


shared_branch = DFlow.just(1).map(lambda v: v).id("sb")
static_zip_pipeline = DFlow.zip([shared_branch]).id("zz").init("durable-zip-static")


def test_a_registered_branch_keeps_its_static_reference_inside_a_run_time_chain() -> None:
    codec = ChainCodec("secret")
    branch = compile_flow(shared_branch)
    static_ref, _ = codec.ref(branch)
    assert static_ref.startswith("p:")
    codec.ref(compile_flow(DFlow.zip([shared_branch, DFlow.just(2).id("x")]).id("z2")))
    assert codec.ref(branch) == (static_ref, None)


def test_a_flow_needing_code_a_worker_lacks_is_unknown_there() -> None:
    payload = pickle.dumps(compile_flow(DFlow.just(1).id("j")))
    payload = payload.replace(b"dflow.flow", b"dflow.nope")
    blob = hmac.new(b"k", payload, hashlib.sha256).digest() + payload
    ref = "h:" + hashlib.sha256(payload).hexdigest()
    with pytest.raises(UnknownStepError, match="needs code this worker does not have"):
        ChainCodec("k").load(ref, blob)


def test_unpicklable_capture_is_named_at_build_time() -> None:
    client = Client()
    chain = compile_flow(DFlow.just(1).map(lambda v: client.get(v)).id("fetch"))
    with pytest.raises(BuildError, match="variable 'client' captured by the function of map.*dflow.shared"):
        ChainCodec("s").ref(chain)


def test_shared_objects_travel_by_name() -> None:
    client = dflow.shared(Client(), "test-http-client")
    chain = compile_flow(DFlow.just(1).map(lambda v: client.get(v)).id("fetch"))
    ref, blob = ChainCodec("s").ref(chain)
    assert blob is not None and len(blob) < 4000
    loaded = ChainCodec("s").load(ref, blob)
    captured = loaded.nodes[1]._fn.__closure__[0].cell_contents
    assert captured is client, "resolves to this process's own instance"


def test_a_secret_is_required() -> None:
    with pytest.raises(dflow.ConfigurationError, match="DFLOW_SECRET"):
        ChainCodec(None)
