"""The crawler that the worker processes of ``test_crawler_distributed.py`` import
(``dflow worker tests.integration.apps.crawler_app``), declared at import time as an application
would: the same object serves local mode (the test process) and the workers.

Its models are the scripted ones of ``tests/agents/site.py``: research follows every link of
the shop and answers from the page that shows the Zephyr 9's warranty; the start URL (the
shop's port) is given with each run.
"""

from __future__ import annotations

from dflow_agents.crawler import (
    CrawlBudget,
    CrawlFunctions,
    DeepCrawlerAgent,
    research_function,
    summary_function,
    validation_function,
)
from dflow_agents.fetch import Fetcher
from dflow_agents.testing import FunctionModel
from tests.agents import site

PAGE_BUDGET = 256 * 1024

crawler = DeepCrawlerAgent(
    "it-crawler",
    functions=CrawlFunctions(
        research=research_function(FunctionModel(site.bfs_research, name="bfs-research")),
        validation=validation_function(FunctionModel(site.validate, name="validate")),
        summary=summary_function(FunctionModel(site.summarize, name="summarize")),
    ),
    crawler=Fetcher(max_bytes=PAGE_BUDGET, allow_private=True),
    budget=CrawlBudget(max_pages=60),
)
