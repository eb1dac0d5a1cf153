"""Small English helpers shared by probes and data code (not world-specific: a probe may import this, never
the world's own text module)."""
from __future__ import annotations


def article(word: str) -> str:
    """'a' or 'an' by the first letter (the rule the world's captions also follow)."""
    return "an" if word[:1].lower() in ("a", "e", "i", "o", "u") else "a"


def with_article(phrase: str) -> str:
    """'a star', 'an arrow', 'a traffic light'."""
    return f"{article(phrase)} {phrase}"
