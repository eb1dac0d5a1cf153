"""What the fork server of ``tests.conftest.Forked`` makes once besides importing train.py's modules: the tiny world
models' tokenizer, which ``negft.models`` keeps per process (open_clip's BPE parses its 262k merges each time it is
built, a fifth of a second, and every run a test forks would build it)."""
from negft import models

models.build("negft-tiny", "")      # negft-tiny-rn's text tower, and so its tokenizer, is negft-tiny's
