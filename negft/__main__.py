"""``python -m negft ...``: the ``negft`` console script without it on PATH."""
import sys

from negft.commands.cli import main

sys.exit(main())
