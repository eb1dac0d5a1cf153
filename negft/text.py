"""Small English helpers shared by probes and data code (not world-specific: a probe may import this, never
the world's own text module)."""
from __future__ import annotations

import re

# how a user gets spaCy and one of its models: the package's optional extra (spaCy is on PyPI) and spaCy's own
# download command (its models are not)
SPACY_INSTALL = "pip install 'negft[negatives]' && python -m spacy download {model}"

# negation cues of English captions (the world's templates use the first four)
NEGATION_WORDS = ("no", "not", "without", "absent", "none", "nothing", "never", "lacking", "lacks",
                  "missing", "nowhere", "n't", "neither", "nor", "free of")
_NEG_RE = re.compile(r"\b(" + "|".join(re.escape(w) for w in NEGATION_WORDS if w != "n't") + r")\b|n't",
                     re.IGNORECASE)


def has_negation(text: str) -> bool:
    return _NEG_RE.search(text) is not None


def article(word: str) -> str:
    """'a' or 'an' by the first letter (the rule the world's captions also follow)."""
    return "an" if word[:1].lower() in ("a", "e", "i", "o", "u") else "a"


def with_article(phrase: str) -> str:
    """'a star', 'an arrow', 'a traffic light'."""
    return f"{article(phrase)} {phrase}"
