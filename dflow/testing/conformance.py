"""Contract test suites that every ``Store`` and ``Transport`` must pass.

Subclass one in a test module and provide its fixture::

    class TestMyStore(StoreContract):
        @pytest.fixture
        def make_store(self):
            return lambda **opts: MyStore(url, **opts)

``make_store(ttl=..., blob_ttl=..., redispatch_after=...)`` returns a fresh, empty store.
``StoreContract`` is the whole store: its write side (``RunWriterContract``, in ``writes``
and ``joins``), its read side (``RunReaderContract``, ``reads``), its listings
(``RunListingContract``, ``listing``; oldest first: ``OldestFirstListingContract``,
``listing_oldest``), the cancelling of runs that hold compensations
(``SagaStoreContract``, ``saga``), the workers' beats (``WorkerBeatsContract``, ``workers``:
skipped for a store that keeps none), the calls that come early (``MailboxContract``, ``mailbox``)
and the runs' deadlines (``DeadlineContract``, ``deadlines``: skipped for a store that keeps
none); a suite for one part needs the same fixture.
``make_fused(**opts)`` (``FusedStoreContract``, ``fused``) returns a fresh ``FusedDispatch``
store and the transport it writes to; ``make_backend()`` (``StateBackendContract``,
``state``) a fresh shared-state backend; ``make_bucket()`` (``TokenBucketContract``,
``rate_limits``) a store's fresh token buckets; ``make_transports(n, redeliver_after=...)``
(``TransportContract``, ``transport``) ``n`` consumers of one fresh queue. Tests are async
functions run with ``asyncio.run``.
"""

from __future__ import annotations

from .cases import MALFORMED_MESSAGES
from .deadlines import DeadlineContract
from .fused import FusedStoreContract
from .listing import RunListingContract
from .listing_oldest import OldestFirstListingContract
from .mailbox import MailboxContract
from .rate_limits import TokenBucketContract
from .reads import RunReaderContract
from .saga import SagaStoreContract
from .state import StateBackendContract
from .step_records import StepRecordsContract
from .transport import TransportContract
from .workers import WorkerBeatsContract
from .writes import RunWriterContract

__all__ = [
    "MALFORMED_MESSAGES",
    "DeadlineContract",
    "FusedStoreContract",
    "MailboxContract",
    "OldestFirstListingContract",
    "RunListingContract",
    "RunReaderContract",
    "RunWriterContract",
    "SagaStoreContract",
    "StateBackendContract",
    "StoreContract",
    "TokenBucketContract",
    "TransportContract",
    "WorkerBeatsContract",
]


class StoreContract(
    RunWriterContract,
    RunReaderContract,
    RunListingContract,
    OldestFirstListingContract,
    SagaStoreContract,
    MailboxContract,
    DeadlineContract,
    WorkerBeatsContract,
    StepRecordsContract,
):
    """What a ``Store`` must do: every part of it. Needs the fixture
    ``make_store(**options) -> Store``, a plain store (one that returns the messages to
    publish; ``FusedStoreContract`` checks what a ``FusedDispatch`` store does besides)."""
