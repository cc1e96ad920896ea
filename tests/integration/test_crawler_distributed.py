"""The deep crawler on real worker processes: ``dflow worker`` subprocesses serving
``tests.integration.apps.crawler_app`` over Redis Streams, the Redis store, and the shop of
``tests/agents/site.py`` served by this process on 127.0.0.1.

* a crawl on a worker process gives what it gives in local mode, and requests the same
  pages, each once (robots.txt included), never one robots.txt disallows;
* a worker killed (``kill -9``) while a wave's page is in flight costs that page only: a new
  worker fetches it again and the crawl completes; every other page was requested once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest

import dflow
from dflow import DFlow, StepStatus
from dflow_agents import AgentStatus
from tests.agents import site as S
from tests.support.runs import runs_of, wait_for, worker_pids
from tests.support.workers import Cluster

from .apps import crawler_app as app


@pytest.fixture
def cluster(redis_url: str, prefix: str) -> Iterator[Cluster]:
    with Cluster("tests.integration.apps.crawler_app", redis_url, prefix) as c:
        yield c


def committed_fetches(trace_id: str) -> list[str]:
    """The URLs of the fetch steps a run has committed (one step per page; its input is
    ``[url, max_bytes, keep]``)."""
    return [
        s.input[0]
        for steps in runs_of(trace_id)
        for s in steps
        if s.status is StepStatus.DONE and s.key.split(">")[0] == "fetch"
    ]


@pytest.mark.timeout(120)
def test_a_crawl_on_a_worker_matches_local_mode(cluster: Cluster) -> None:
    DFlow.global_init_for_test()
    try:
        with S.Site(S.shop()) as site:
            local = app.crawler.run(S.TASK, url=site.url("/")).result(30)
            local_paths = site.paths()
    finally:
        dflow.shutdown()
    cluster.connect()
    cluster.workers.start(1)
    with S.Site(S.shop()) as site:
        run = app.crawler.run(S.TASK, url=site.url("/"))
        remote = run.result(60)
        paths = site.paths()
    assert local.status is AgentStatus.FINISHED and local.answer.startswith("Summary: The Zephyr 9")
    assert remote == local, "the same crawl, the same result"
    assert sorted(paths) == sorted(local_paths), "the same pages"
    assert max(Counter(paths).values()) == 1, "each URL requested once (robots.txt too)"
    assert not [p for p in paths if p.startswith("/private/")]
    assert worker_pids(run.trace_id) == {cluster.workers.procs[0].pid}, "every step ran on the worker process"
    assert len(committed_fetches(run.trace_id)) == len(paths) - 1, "one committed fetch step per page"


@pytest.mark.timeout(120)
def test_a_crawl_survives_a_worker_killed_while_a_page_is_in_flight(cluster: Cluster) -> None:
    held = "/p/laptops/zephyr-9.html"  # in the first wave of depth 2, with 15 others
    cluster.connect()
    cluster.workers.start(1)
    with S.Site(S.shop()) as site:
        gate = site.hold(held)
        run = app.crawler.run(S.TASK, url=site.url("/"))
        wait_for("the held page to be requested", lambda: site.holding == [held], 30)

        def rest_of_the_wave_committed() -> bool:  # the wave cannot end (and no later page start) without it
            requested = {
                h.path for h in site.hits if h.path.startswith(("/p/", "/c/laptops/")) and h.path != held
            }
            committed = {u.removeprefix(site.base_url) for u in committed_fetches(run.trace_id)}
            return len(requested) == 15 and requested <= committed

        wait_for("the rest of the wave to commit", rest_of_the_wave_committed, 30)
        cluster.workers.kill_one()
        gate.set()  # the killed worker's request ends; nobody reads its answer
        cluster.workers.start(1)
        result = run.result(60)
        counts = Counter(site.paths())
    assert result.status is AgentStatus.FINISHED and result.answer.startswith("Summary: The Zephyr 9"), result
    assert counts[held] == 2, "the page in flight at the kill was fetched again"
    assert {p: n for p, n in counts.items() if n != 1} == {held: 2}, "every other URL was requested once"
    assert len(committed_fetches(run.trace_id)) == sum(counts.values()) - 2, "one committed fetch per page"
