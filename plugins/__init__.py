"""loopwarden's built-in plugins: one module per defence line, plus observers.

Built-in plugins register exactly like third-party ones: they are named in ``[plugins]
enabled`` and configured in ``[plugins.<name>]``.  See ``loopwarden plugins`` for the order in
effect and the README for every plugin's settings.
"""
