"""Tests of dflow_agents: the LLM layer, the tools and the test doubles."""
