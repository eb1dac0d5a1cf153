"""LoRA on the text tower (``model.lora``): peft's adapters injected into open_clip's model object, and the merged
plain open_clip weights every checkpoint holds.

peft's ``inject_adapter_in_model`` swaps each targeted ``nn.Linear`` for a ``lora.Linear`` in place, so the
model stays open_clip's (``encode_text``, ``encode_text_trimmed``'s block loop, DeepSpeed, checkpoint resume all
see the same object). Its state dict then holds ``...base_layer.weight`` and ``...lora_A/B.default.weight``
keys; ``plain_state`` folds them back into open_clip's names, so a checkpoint or release loads without peft.
"""
from __future__ import annotations

import torch

from negft.config import ConfigError, LoraCfg
from negft.towers import tower_of

ADAPTER = "default"                   # peft's name for the one adapter
ADAPTER_KEYS = (".lora_A.", ".lora_B.")
BASE = ".base_layer"


def is_adapter(name: str) -> bool:
    """Whether a parameter or state-dict key is an adapter's (``lora_A`` / ``lora_B``)."""
    return any(k in name for k in ADAPTER_KEYS)


def has_adapters(model: torch.nn.Module) -> bool:
    return any(is_adapter(name) for name, _ in model.named_parameters())


def targets(model: torch.nn.Module, suffixes: list[str]) -> list[str]:
    """The text tower's module names that end with one of ``suffixes`` (``model.lora.targets``).

    Only an ``nn.Linear`` whose own forward runs can take an adapter here. ``nn.MultiheadAttention`` reads its
    ``in_proj_weight`` and ``out_proj.weight`` directly (``F.multi_head_attention_forward``), so an adapter on
    ``attn.out_proj`` would change nothing; peft's adapter for the attention module itself adds its delta into
    the frozen weights before every forward and subtracts it after, which rounds them (they drifted by 2e-5 in
    five steps of negft-tiny) and re-registers them as new parameters behind DeepSpeed's back.
    """
    text = {name: m for name, m in model.named_modules() if name and tower_of(name) == "t"}
    attention = {name for name, m in text.items() if isinstance(m, torch.nn.MultiheadAttention)}
    linear = sorted({name.rsplit(".", 2)[-2] + "." + name.rsplit(".", 1)[-1] for name, m in text.items()
                     if isinstance(m, torch.nn.Linear) and name.rsplit(".", 1)[0] not in attention})
    found = []
    for suffix in suffixes:
        names = [n for n in text if n == suffix or n.endswith("." + suffix)]
        if not names:
            raise ConfigError(f"bad value '{suffix}' in 'model.lora.targets': no module of the text tower ends with "
                              f"it (its linear layers: {', '.join(linear) or 'none'})")
        for n in names:
            inside_attention = n in attention or n.rsplit(".", 1)[0] in attention
            if inside_attention or not isinstance(text[n], torch.nn.Linear):
                why = ("nn.MultiheadAttention does not call it (attn.out_proj) or cannot take an adapter without "
                       "changing its frozen weights (attn)" if inside_attention else
                       f"it is a {type(text[n]).__name__}, not an nn.Linear")
                raise ConfigError(f"bad value '{suffix}' in 'model.lora.targets': '{n}' cannot take an adapter: {why}. "
                                  f"Name linear layers: {', '.join(linear)}")
        found += names
    return sorted(set(found))


def inject(model: torch.nn.Module, cfg: LoraCfg) -> None:
    """Put adapters on the text tower's ``cfg.targets`` in place (B starts at zero: the model computes as before).
    peft marks only adapters trainable; ``models.set_trainable`` decides after it."""
    import re
    from peft import LoraConfig, inject_adapter_in_model
    names = targets(model, list(cfg.targets))
    # a full-match pattern: peft would match a plain name list by suffix, which reaches visual.transformer too
    pattern = "(" + "|".join(re.escape(n) for n in names) + ")"
    inject_adapter_in_model(LoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                                       target_modules=pattern), model, adapter_name=ADAPTER)


def plain_state(model: torch.nn.Module, state: dict | None = None) -> dict:
    """open_clip's state dict of an adapted ``model`` with each adapter merged: W + (alpha / rank)·B·A under W's
    own key, no adapter or ``base_layer`` keys; the live model is not changed. ``state`` overrides entries of
    ``model.state_dict()`` (DeepSpeed's fp32 master copies). The merge is computed in fp32."""
    from peft.tuners.lora import LoraLayer
    state = {**model.state_dict(), **(state or {})}
    for name, m in model.named_modules():
        if isinstance(m, LoraLayer) and ADAPTER in m.lora_A:
            a, b = (state.pop(f"{name}.lora_{x}.{ADAPTER}.weight").float() for x in "AB")
            key = f"{name}{BASE}.weight"
            state[key] = state[key].float() + (b @ a) * m.scaling[ADAPTER]
    return {k.replace(BASE, ""): v for k, v in state.items()}
