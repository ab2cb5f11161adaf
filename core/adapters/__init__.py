"""loopwarden's guards inside the agent frameworks people already use.

One ``config.toml``, the same plugins (built-in and third-party), the same run records,
signals, metrics and alerts -- driven by a framework's own agent loop:

``loopwarden.adapters.langchain``      ``LoopwardenMiddleware`` for LangChain v1 ``create_agent``
``loopwarden.adapters.openai_agents``  ``LoopwardenRunner`` for the OpenAI Agents SDK
``loopwarden.adapters.pydantic_ai``    ``Loopwarden``, a pydantic-ai capability

Each framework is an optional extra (``pip install 'loopwarden[langchain]'``,
``[openai-agents]``, ``[pydantic-ai]``), imported only by its adapter module -- never by
``import loopwarden`` or by this package.  The natures of the framework's tools come from
``[tools.<name>]`` tables in ``config.toml``.  See docs/adapters.md.

May import: the engine (an adapter drives the same step machine from a framework's loop),
the recorded-traffic tools, deployments and the public vocabulary; never the commands, the
docs generator, the demo or the test kit.  The engine never imports an adapter.
"""

from __future__ import annotations

__all__: list[str] = []
