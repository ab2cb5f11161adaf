"""``python -m loopwarden.docs``: regenerate (or ``--check``) the generated reference pages."""

from __future__ import annotations

import sys

from loopwarden.docs import main

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
