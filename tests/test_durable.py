"""Flows that travel between workers: signed blobs, static references, shared objects."""

from __future__ import annotations

import hashlib
import hmac
import pickle
import threading

import msgpack
import pytest

import dflow
from dflow import BuildError, DFlow, PayloadRejectedError, UnknownStepError
from dflow.model import interpret
from dflow.model.chains import ChainCodec
from dflow.model.frames import FrameCodec
from dflow.model.nodes import Frame, compile_flow
from dflow.observe import PIPELINE_KEY, kept_pipeline
from dflow.wire.values import Message, encode

KEY = "k" * 32  # a signing key is at least 32 bytes
OTHER = "o" * 32

static = DFlow.from_call("durable-entry").map(lambda x: x).id("a").init("durable-static")


class Client:
    """Stands for an HTTP client: holds a lock, so it cannot be pickled."""

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def get(self, x: int) -> int:
        return x + 1


def test_static_chains_travel_by_reference() -> None:
    codec = ChainCodec(KEY)
    ref, blob = codec.ref(static._chain)
    assert ref.startswith("p:") and len(ref) == 26 and blob is None, "a digest of the head key"
    assert ChainCodec(KEY).cached(ref) is static._chain
    with pytest.raises(UnknownStepError, match="does not import the module"):
        ChainCodec(KEY).cached("p:0123456789abcdef01234567")


def test_chains_built_at_run_time_travel_signed() -> None:
    offset = 5
    chain = compile_flow(DFlow.just(1).map(lambda v: v + offset).id("add"))
    ref, blob = ChainCodec(KEY).ref(chain)
    assert ref.startswith("h:") and blob is not None
    loaded = ChainCodec(KEY).load(ref, blob)
    assert loaded.keys == chain.keys
    assert loaded.nodes[1]._fn(1) == 6, "the captured value travelled with the chain"
    tampered = blob[:-3] + bytes([blob[-3] ^ 1]) + blob[-2:]
    with pytest.raises(PayloadRejectedError, match="signature"):
        ChainCodec(KEY).load(ref, tampered)
    with pytest.raises(UnknownStepError, match="signed with a key this process does not have"):
        ChainCodec(OTHER).load(ref, blob)  # parked until a worker with the key takes it
    with pytest.raises(PayloadRejectedError, match="missing"):
        ChainCodec(KEY).load(ref, None)


def test_branches_of_a_chain_built_at_run_time_travel_inside_its_blob() -> None:
    offset = 10
    inner = DFlow.zip([DFlow.just(i).map(lambda v: v + offset).id("b") for i in range(3)]).id("z")
    zipped = compile_flow(inner)
    codec = ChainCodec(KEY)
    ref, blob = codec.ref(zipped)
    assert blob is not None
    branch = compile_flow(inner._branches[2])
    assert codec.ref(branch) == (f"{ref}/0.2", blob), "a branch travels in its parent's blob"
    fresh = ChainCodec(KEY)
    assert fresh.cached(f"{ref}/0.2") is None
    loaded = fresh.load(f"{ref}/0.2", blob)  # given the parent's blob
    assert loaded.keys == branch.keys and loaded.nodes[1]._fn(2) == 12
    assert fresh.cached(f"{ref}/0.1") is not None, "its sibling came with the same blob"
    assert codec.blob_of(f"{ref}/0.2") == ref
    with pytest.raises(PayloadRejectedError, match="no branch"):
        ChainCodec(KEY).load(f"{ref}/5.0", blob)
    tampered = blob[:-3] + bytes([blob[-3] ^ 1]) + blob[-2:]
    with pytest.raises(PayloadRejectedError, match="signature"):
        ChainCodec(KEY).load(f"{ref}/0.2", tampered)


shared_branch = DFlow.just(1).map(lambda v: v).id("sb")
static_zip_pipeline = DFlow.zip([shared_branch]).id("zz").init("durable-zip-static")


def test_a_registered_branch_keeps_its_static_reference_inside_a_run_time_chain() -> None:
    codec = ChainCodec(KEY)
    branch = compile_flow(shared_branch)
    static_ref, _ = codec.ref(branch)
    assert static_ref.startswith("p:")
    codec.ref(compile_flow(DFlow.zip([shared_branch, DFlow.just(2).id("x")]).id("z2")))
    assert codec.ref(branch) == (static_ref, None)


def test_a_flow_needing_code_a_worker_lacks_is_unknown_there() -> None:
    payload = pickle.dumps(compile_flow(DFlow.just(1).id("j")))
    payload = payload.replace(
        b"dflow.model.nodes", b"dflow.model.nope_"
    )  # same length: the pickle stays well-formed
    blob = hmac.new(KEY.encode(), payload, hashlib.sha256).digest() + payload
    ref = "h:" + hashlib.sha256(payload).hexdigest()
    with pytest.raises(UnknownStepError, match="needs code this worker does not have"):
        ChainCodec(KEY).load(ref, blob)


def test_unpicklable_capture_is_named_at_build_time() -> None:
    client = Client()
    chain = compile_flow(DFlow.just(1).map(lambda v: client.get(v)).id("fetch"))
    with pytest.raises(BuildError, match="variable 'client' captured by the function of map.*dflow.shared"):
        ChainCodec(KEY).ref(chain)


def test_shared_objects_travel_by_name() -> None:
    client = dflow.shared(Client(), "test-http-client")
    chain = compile_flow(DFlow.just(1).map(lambda v: client.get(v)).id("fetch"))
    ref, blob = ChainCodec(KEY).ref(chain)
    assert blob is not None and len(blob) < 4000
    loaded = ChainCodec(KEY).load(ref, blob)
    captured = loaded.nodes[1]._fn.__closure__[0].cell_contents
    assert captured is client, "resolves to this process's own instance"


def test_a_secret_is_required_and_long_enough() -> None:
    with pytest.raises(dflow.ConfigurationError, match="DFLOW_SECRET"):
        ChainCodec(None)
    with pytest.raises(
        dflow.ConfigurationError, match="DFLOW_SECRET is 1 bytes; a signing key needs at least 32"
    ):
        ChainCodec("x")
    with pytest.raises(dflow.ConfigurationError, match="key 2 of DFLOW_SECRET is 5 bytes"):
        ChainCodec(f"{KEY},short")


def test_keys_rotate_sign_with_the_first_verify_with_any() -> None:
    old = ChainCodec(OTHER)
    ref, blob = old.ref(compile_flow(DFlow.just(1).map(lambda v: v + 2).id("add")))
    both = ChainCodec(f"{KEY}, {OTHER}")  # the new key first, the old one still accepted
    assert both.load(ref, blob).nodes[1]._fn(1) == 3
    ref2, blob2 = both.ref(compile_flow(DFlow.just(1).map(lambda v: v + 3).id("add")))
    assert ChainCodec(KEY).load(ref2, blob2).nodes[1]._fn(1) == 4, "signed with the new key"
    with pytest.raises(UnknownStepError):
        ChainCodec(OTHER).load(ref2, blob2)


def test_frames_records_are_signed_for_their_run() -> None:
    codec = ChainCodec(KEY)
    record = codec.seal_frames("run-a", b"frames of a")
    assert codec.open_frames("run-a", record) == b"frames of a"
    with pytest.raises(PayloadRejectedError, match="frames record of run 'run-b' fails its signature check"):
        codec.open_frames("run-b", record)  # another run's frames: refused
    forged = record[:-1] + b"b"
    with pytest.raises(PayloadRejectedError):
        codec.open_frames("run-a", forged)
    _, blob = codec.ref(compile_flow(DFlow.just(1).map(inc).id("x").map(inc).id("y")))
    with pytest.raises(PayloadRejectedError):
        codec.open_frames("run-a", blob)  # a blob's signature is no frames signature


LOCK = threading.Lock()


def test_a_global_used_in_a_nested_lambda_is_named() -> None:
    def step(v: int) -> int:
        return (lambda: LOCK)() and v

    with pytest.raises(BuildError, match="global 'LOCK' used by the function of map\\(step\\)"):
        ChainCodec(KEY).ref(compile_flow(DFlow.just(1).map(step).id("s")))


@pytest.mark.usefixtures("local")
def test_local_mode_refuses_what_a_worker_could_not_load() -> None:
    def build(x: int) -> DFlow[int]:
        client = Client()  # holds a lock: it cannot travel to a worker
        return DFlow.just(x).map(lambda w: client.get(w)).id("use")

    r = DFlow.direct_run(1, build)
    with pytest.raises(dflow.RunFailedError, match="variable 'client' captured by the function of map"):
        r.result(5)
    client = Client()
    with pytest.raises(
        BuildError, match="variable 'client' captured by the function of flat_map.*test_durable"
    ):
        DFlow.direct_run(1, lambda x: DFlow.just(client.get(x)))


@pytest.mark.usefixtures("local")
def test_local_mode_runs_the_copy_a_worker_would_run() -> None:
    seen: list[int] = []

    def step(v: int) -> int:
        seen.append(v)  # the copy's list: as on a worker, not this one
        return len(seen)

    out = DFlow.direct_run(7, lambda x: DFlow.just(x).map(step).id("s")).result(5)
    assert out == 1 and seen == []


def _old_format(chain: object) -> bytes:
    """A chain pickled as dflow 0.1.0 stored it: nodes with their whole attribute dicts."""
    import copyreg
    import io

    import cloudpickle

    from dflow.model.nodes import Chain

    class Old(cloudpickle.Pickler):
        def reducer_override(self, obj: object) -> object:
            if type(obj) is DFlow:
                return (copyreg.__newobj__, (DFlow,), dict(obj.__dict__))
            if type(obj) is Chain:
                return (copyreg.__newobj__, (Chain,), (None, {"nodes": obj.nodes, "keys": obj.keys}))
            return super().reducer_override(obj)

    buf = io.BytesIO()
    Old(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(chain)
    return buf.getvalue()


def test_flows_stored_by_an_earlier_version_still_load() -> None:
    offset = 3
    flow = (
        DFlow.zip([DFlow.just(i).map(lambda v: v + offset).id("b") for i in range(2)])
        .id("z")
        .map(sum)
        .id("s")
    )
    payload = _old_format(compile_flow(flow))
    blob = hmac.new(KEY.encode(), payload, hashlib.sha256).digest() + payload
    ref = "h:" + hashlib.sha256(payload).hexdigest()
    loaded = ChainCodec(KEY).load(ref, blob)
    assert loaded.keys == ("z>s", "s")
    assert compile_flow(loaded.nodes[0]._branches[1]).nodes[1]._fn(1) == 4


def inc(v: int) -> int:
    return v + 1


def test_chains_of_one_shape_are_pickled_once_and_their_consumed_head_is_left_out() -> None:
    codec = ChainCodec(KEY)
    first = codec.ref(compile_flow(DFlow.just({"turn": 1}).map(inc).id("inc")))
    again = codec.ref(compile_flow(DFlow.just({"turn": 2}).map(inc).id("inc")))
    assert again == first, "only the consumed head value differs: one blob"
    other = codec.ref(compile_flow(DFlow.just(1).map(inc).id("inc").map(inc).id("more")))
    assert other[0] != first[0]
    # branch heads are not consumed when their parent is stored: they stay in the blob
    a = codec.ref(
        compile_flow(
            DFlow.just(0)
            .map(inc)
            .id("x")
            .flat_map(lambda v: DFlow.zip(DFlow.just(1).map(inc).id("b")))
            .id("fm")
        )
    )
    zipped = [compile_flow(DFlow.zip(DFlow.just(v).map(inc).id("b"), DFlow.just(0)).id("z")) for v in (1, 2)]
    r1, _b1 = codec.ref(zipped[0])
    r2, b2 = codec.ref(zipped[1])
    assert r1 != r2 and a[0] not in (r1, r2)
    loaded = ChainCodec(KEY).load(r2, b2)
    assert loaded.nodes[0]._branches[0]._source._value == 2


def test_captured_values_and_globals_are_keyed_by_content() -> None:
    codec = ChainCodec(KEY)

    def make(offset: object) -> object:
        return compile_flow(DFlow.just(0).map(lambda v: v + offset).id("add").map(inc).id("inc"))  # type: ignore[operator]

    assert codec.ref(make(1)) == codec.ref(make(1)), "same code, same captured value"
    assert codec.ref(make(1))[0] != codec.ref(make(2))[0]
    box = {"n": 1}

    def boxed() -> object:
        return compile_flow(DFlow.just(0).map(lambda v: v + box["n"]).id("add").map(inc).id("inc"))

    before = codec.ref(boxed())[0]
    assert codec.ref(boxed())[0] == before
    box["n"] = 5  # mutated in place: a new chain capturing it is a new blob, not the cached one
    after, blob = codec.ref(boxed())
    assert after != before
    assert ChainCodec(KEY).load(after, blob).nodes[1]._fn(1) == 6


def test_a_blob_with_more_branches_than_the_cache_loads() -> None:
    # Once, past 10,000 branches the parent was evicted by its own branches ("no branch ''").
    flow = DFlow.zip([DFlow.just(i).map(inc).id("b") for i in range(30)]).id("z")
    codec = ChainCodec(KEY, cache_size=10)
    ref, blob = codec.ref(compile_flow(flow))
    fresh = ChainCodec(KEY, cache_size=10)
    assert fresh.load(ref, blob).keys == ("z",)
    assert fresh.load(f"{ref}/0.29", blob).nodes[1]._fn(1) == 2


def _built_at_run_time(x: int) -> DFlow[int]:
    return DFlow.just(x).map(inc).id("in").map(inc).id("out")


tailing = (
    DFlow.from_call("durable-tail").map(inc).id("a").flat_map(_built_at_run_time).id("t").init("durable-tail")
)


def test_a_frames_record_after_a_tail_flat_map_is_the_one_a_release_before_wrote() -> None:
    # the step whose tail flat_map leaves the pipeline's chain keeps the pipeline in the run's
    # data, not in the frames record: a worker of the release before reads the record as ever
    frames = (Frame(tailing._chain, 2),)
    msg = Message("run-a", 2, tailing._chain.keys[2])
    went = interpret.enter(msg, frames, compile_flow(_built_at_run_time(1)))
    assert isinstance(went, interpret.Go) and went.frames is not None
    codec = ChainCodec(KEY)
    record = FrameCodec(codec).dump("run-a", went.frames)[0]
    (f,) = went.frames
    (ref,) = record.blobs
    assert record.record == codec.seal_frames("run-a", msgpack.packb([[ref, f.pos, f.suffix, f.returning]]))
    assert [len(e) for e in msgpack.unpackb(codec.open_frames("run-a", record.record))] == [4]
    assert kept_pipeline(frames, went.frames) == {PIPELINE_KEY: encode("durable-tail")}
    assert kept_pipeline(frames, (Frame(tailing._chain, 3),)) == {}  # (a step of the pipeline's own chain)
