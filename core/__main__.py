"""``python -m loopwarden``."""

import sys

from loopwarden.commands.cli import main

sys.exit(main())
