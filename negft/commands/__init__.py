"""The command layer: one module per command (train, eval, patch, release, data, recipes), each with one dataclass
of its keys, and ``cli`` to dispatch them. Commands import the library and ``keys``, never one another; what two
share lives below them (tests/test_imports.py)."""
