"""Integrations with other frameworks, each an optional extra the core never imports.

One module per runtime (``receiver.contrib.mcp``, ``receiver.contrib.openai_agents``,
``receiver.contrib.langgraph``, ``receiver.contrib.pydantic_ai``, and the durable-execution
runtimes ``receiver.contrib.dbos`` and ``receiver.contrib.prefect``), each a thin layer over the
public API of :mod:`receiver` (the :class:`~receiver.Actions` executor): importing one needs its
extra (``pip install 'receiver-webhooks[mcp]'``), importing :mod:`receiver` never does. A
contrib module may import :mod:`receiver` and its own framework, never another contrib module.
"""
