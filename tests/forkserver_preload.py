"""What the fork server of ``tests.conftest.Forked`` makes once besides importing train.py's modules: the tiny world
models' tokenizer, which ``negft.models`` keeps per process (open_clip's BPE parses its 262k merges each time it is
built, a fifth of a second, and every run a test forks would build it). Nothing here may run a torch operation: a
process forked after OpenMP started its threads hangs in its first parallel region (``make test-slow``, where the
threads are not limited to one, showed it)."""
import json

from negft import models

models.register()                   # "negft-tiny" names negft's config only once registered
models._tokenizer("negft-tiny", json.loads((models.CONFIG_DIR / "negft-tiny.json").read_text())["text_cfg"])
