"""``python -m negft ...``: the ``negft`` console script without it on PATH."""
import sys

from negft.cli import main

sys.exit(main())
