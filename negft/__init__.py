"""negft: fine-tune open_clip models for negation and composition, probe them every epoch, patch, release.

``negft.evaluate(model, preprocess, tokenizer, suite=..., data=...)`` runs a probe suite over any model with
``encode_image`` / ``encode_text`` (``negft.evaluation.evaluate``); it is imported when first used, so that
``import negft`` stays cheap (no torch, no open_clip)."""
import importlib

__version__ = "0.1.0"


def __getattr__(name: str):
    if name == "evaluate":
        return importlib.import_module("negft.evaluation").evaluate
    raise AttributeError(f"module 'negft' has no attribute '{name}'")
