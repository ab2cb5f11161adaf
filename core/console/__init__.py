"""The console: a web page over the run records and the shared store (``loopwarden console``).

* :mod:`loopwarden.console.index` -- the records' SQLite index, built by byte offset;
* :mod:`loopwarden.console.figures` -- the overview's figures (``loopwarden report``'s own);
* :mod:`loopwarden.console.pages` -- the HTML, every text escaped, charts as SVG;
* :mod:`loopwarden.console.app` -- :class:`Console`, a framework-free request handler that
  the stand-alone server (:mod:`loopwarden.console.server`) and the gateway both serve;
* ``static/`` -- the stylesheet and the small script that polls for new runs.

May import: the public vocabulary, the report, the redaction, the paths and (through the
command) the store; the engine never imports it -- a run's path does not know it exists.
"""

from __future__ import annotations

from loopwarden.console.app import Console, Response, StoreView
from loopwarden.console.index import RecordIndex

__all__ = ["Console", "RecordIndex", "Response", "StoreView"]
