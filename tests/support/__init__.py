"""Test-only support for loopwarden's own suite: local servers and fixtures that need a network
port, a subprocess or a store (the OpenAI-compatible stub, webhook receivers, SQLite and
redis-server stores), and recipes shared by one family of tests (adapters, observability,
budgets, hook-level detectors).

Anything a plugin author would need belongs in the public kit, :mod:`loopwarden.testing`, not
here: these modules build on it and never copy it.
"""
