"""Build, load and save open_clip models; the tiny world architectures; tower freezing.

Every model is an open_clip model. Checkpoints are written in open_clip's ``local-dir:`` layout
(``open_clip_config.json`` + ``open_clip_model.safetensors``) so
``open_clip.create_model_and_transforms("local-dir:DIR")`` loads them with no negft import.
"""
from __future__ import annotations

import contextlib
import difflib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import open_clip
import torch
from open_clip.modified_resnet import ModifiedResNet
from safetensors.torch import save_file

from negft import lora
from negft.config import HF_HUB, LOCAL_DIR, ConfigError, source
from negft.io import as_umask_allows, atomic_path
from negft.towers import tower_of

CONFIG_DIR = Path(__file__).parent / "model_configs"
CONFIG_FILE = "open_clip_config.json"
WEIGHTS_FILE = "open_clip_model.safetensors"
_registered = False


def register() -> None:
    """Make the tiny world architectures (``negft-tiny``, ...) known to open_clip by name."""
    global _registered
    if not _registered:
        open_clip.add_model_config(CONFIG_DIR)
        _registered = True


@dataclass
class Bundle:
    """A model with the transforms and tokenizer that belong to it."""
    model: torch.nn.Module
    preprocess_train: object
    preprocess_val: object
    tokenizer: object
    model_cfg: dict
    preprocess_cfg: dict


def load(text: str, arch: str = "", quick_gelu: bool | None = None, key: str = "model.pretrained",
         verify: bool = True, name_arch: str = "model=ARCH") -> Bundle:
    """The model ``text`` names (``source``), given as key ``key``: a release whose files fail its ``SHA256SUMS`` is
    refused unless ``verify`` is false; a file or a tag needs ``arch`` (``name_arch`` says how to give it), a
    local-dir or hf-hub: brings its own. Built as ``build`` builds any model."""
    from negft.checksums import check_release
    src = source(text)
    if src.path is not None:
        check_release(key, src.path, verify)
        if not src.path.exists():
            raise FileNotFoundError(f"{key} '{text}' is neither a checkpoint directory nor a file")
    if not arch and src.kind in ("file", "tag") and text:
        raise ValueError(f"{key}='{text}' needs an architecture and none is recorded: pass {name_arch}, or a model "
                         "that carries its own (a checkpoint directory, local-dir:DIR, hf-hub:ORG/NAME)")
    return build(arch, src.pretrained, quick_gelu, key=key)


def _is_local_dir(pretrained: str) -> bool:
    return pretrained.startswith(LOCAL_DIR) or (Path(pretrained).is_dir() and (Path(pretrained) / CONFIG_FILE).exists())


def _unreadable(e: BaseException) -> bool:
    """Whether loading failed on a truncated or corrupt file (not a missing or refused one): safetensors' header
    errors, torch.load's zip reader, a cut pickle, a cut ``open_clip_config.json``."""
    text = str(e)
    return ((type(e).__name__ == "SafetensorError" and "I/O error" not in text)
            or (isinstance(e, RuntimeError) and ("PytorchStreamReader" in text or "zip archive" in text))
            or isinstance(e, (EOFError, json.JSONDecodeError)))


def _weights_whole(build_model):
    """``build`` whose truncated or corrupt weights file ends in a ``ConfigError`` naming it, not the loader's
    traceback: a checkpoint copied in part, or a weights file cut short by a full disk."""
    import functools

    @functools.wraps(build_model)
    def checked(arch: str, pretrained: str = "", *args, **kwargs) -> Bundle:
        try:
            return build_model(arch, pretrained, *args, **kwargs)
        except Exception as e:
            if not _unreadable(e):
                raise
            folder = Path(pretrained.removeprefix(LOCAL_DIR))
            named = (_local_weights(folder) or folder) if folder.is_dir() else pretrained
            why = str(e).splitlines()[0].split(". ")[0][:160] if str(e) else type(e).__name__
            raise ConfigError(f"'{named}' is truncated or corrupt, not a whole weights file ({why}): copy or write it "
                              "again, or pass another checkpoint") from None
    return checked


@_weights_whole
def build(arch: str, pretrained: str = "", quick_gelu: bool | None = None, key: str = "model.pretrained",
          **kwargs) -> Bundle:
    """An open_clip model from an architecture name and ``pretrained`` = tag | file | local-dir | hf-hub | "".

    A ``local-dir`` (or a directory holding ``open_clip_config.json``) and ``hf-hub:ORG/NAME`` carry their own
    architecture, so ``arch`` is ignored for them. A tag or a Hub repository must already be in the local cache:
    nothing is downloaded (unless ``HF_HUB_OFFLINE=0`` is set), and the error says at once what to pass instead.

    The activation (QuickGELU or GELU) must be the one the weights were trained with, and nothing in a
    weights file's keys or shapes records it: OpenAI's CLIP and LAION-400M's ViT-B-32 used QuickGELU, while
    open_clip's ``ViT-B-32`` config builds GELU, and open_clip 3.x only warns about the mismatch, even for
    the ``openai`` tag. The wrong one loads without an error and costs accuracy (the NegBench, ARO and
    SugarCrepe evaluations of fine-tuned OpenAI models hit this). So the activation follows the weights'
    provenance where it is recorded, and ``build`` refuses to guess where it is not:

    1. ``quick_gelu`` (recipe key ``model.quick_gelu``) or an arch named ``*-quickgelu``: the user said so.
    2. A tag: open_clip's pretrained record says what its weights used (``quick_gelu`` in ``pretrained.py``).
    3. A local-dir or hf-hub: its ``model_cfg`` is what the weights were built and trained with, an absent
       ``quick_gelu`` meaning GELU, as open_clip builds it.
    4. A bare file (``_file_provenance``): OpenAI's own layout (the TorchScript archive's extra buffers)
       means QuickGELU. A 1-element ``logit_scale`` means a model negft built (OpenAI's, and open_clip's by
       default, are 0-d), not OpenAI's file: ``arch`` as named. Any other file of an architecture that has
       QuickGELU weights is refused, since OpenAI's plain state dict, a LAION one and a model fine-tuned
       from either have the same keys and shapes: only the user knows which it is.

    The choice is recorded in ``Bundle.model_cfg`` (``quick_gelu``), so checkpoints written from it say. ``key``:
    the command-line key that gave ``pretrained``, which a message names.
    """
    register()
    # A 1-element logit_scale: DeepSpeed's parameter broadcast cannot view a 0-d tensor as bytes.
    kwargs.setdefault("nonscalar_logit_scale", True)
    if pretrained.startswith(HF_HUB) or (pretrained and _is_local_dir(pretrained)):
        return _build_carried(pretrained, quick_gelu, kwargs)
    if arch not in open_clip.list_models():
        near = difflib.get_close_matches(arch, open_clip.list_models(), n=5, cutoff=0.5)
        raise ValueError(f"unknown architecture '{arch}'" + (f". Did you mean: {', '.join(near)}?" if near else "")
                         + f" (open_clip.list_models() lists them; negft adds: "
                         f"{', '.join(p.stem for p in CONFIG_DIR.glob('*.json'))})")
    arch_cfg = open_clip.get_model_config(arch)
    named = bool(arch_cfg.get("quick_gelu", False))
    state = None
    if pretrained and os.path.isfile(pretrained):
        act, state = _file_quick_gelu(arch, pretrained, named, quick_gelu)
    elif pretrained:
        _check_tag_cached(arch, pretrained, key)
        tagged = bool(open_clip.get_pretrained_cfg(arch, pretrained).get("quick_gelu", False))
        act = tagged if quick_gelu is None else bool(quick_gelu)
    else:
        act = named if quick_gelu is None else bool(quick_gelu)
    read_whole = bool(pretrained) and os.path.isfile(pretrained) and _read_strictly(pretrained)   # also an OpenAI dump
    with _hub_offline(os.environ.get("HF_HUB_OFFLINE", "1")), _weights_follow(read_whole):
        model, pre_train, pre_val = open_clip.create_model_and_transforms(
            arch, pretrained=None if state is not None else (pretrained or None), **_act_kwargs(act), **kwargs)
    if state is not None:
        _load_openai_dump(model, state)
    _channels_last_input(model)
    tokenizer = _tokenizer(arch, arch_cfg.get("text_cfg", {}))
    model_cfg = {**arch_cfg, "quick_gelu": act,
                 "nonscalar_logit_scale": kwargs["nonscalar_logit_scale"]}
    pp = model.visual.preprocess_cfg if hasattr(model.visual, "preprocess_cfg") else {}
    return Bundle(model, pre_train, pre_val, tokenizer, model_cfg, dict(pp))


_TOKENIZERS: dict = {}


def _tokenizer(name: str, text_cfg: dict):
    """``open_clip.get_tokenizer(name)``, built once per process for each text config (what open_clip builds it
    from; a Hugging Face tokenizer's name may be a path relative to ``name``'s folder, so then ``name`` counts
    too): open_clip's BPE tokenizer parses its 262k merges on every call, a fifth of a second on a slow core,
    and a patching sweep or an evaluation against a base builds several models. Tokenizers keep no state a
    call changes (the BPE memo only caches)."""
    key = (json.dumps(text_cfg, sort_keys=True, default=str), name if "hf_tokenizer_name" in text_cfg else None)
    if key not in _TOKENIZERS:
        _TOKENIZERS[key] = open_clip.get_tokenizer(name)
    return _TOKENIZERS[key]


def _build_carried(pretrained: str, quick_gelu: bool | None, kwargs: dict) -> Bundle:
    """``build`` for a source that carries its own ``open_clip_config.json``: a local-dir (or a directory holding
    one) or ``hf-hub:ORG/NAME`` from the Hugging Face cache. Its ``model_cfg`` is what the weights were built and
    trained with, so it says the activation (``build``, rule 3)."""
    if pretrained.startswith(HF_HUB):
        name = pretrained
        cfg, weights = _hub_files(pretrained[len(HF_HUB):])
    else:
        name = pretrained if pretrained.startswith(LOCAL_DIR) else LOCAL_DIR + pretrained
        cfg = json.loads((Path(name[len(LOCAL_DIR):]) / CONFIG_FILE).read_text())
        weights = _local_weights(Path(name[len(LOCAL_DIR):]))
    act = bool(cfg["model_cfg"].get("quick_gelu", False)) if quick_gelu is None else bool(quick_gelu)
    if weights is not None and weights.suffix != ".safetensors" and _is_torchscript(str(weights)):
        raise ConfigError(f"'{weights}' is a TorchScript archive; negft does not read those (torch.jit.load "
                          "runs the code inside). Put the weights there as open_clip_model.safetensors")
    import pickle
    try:
        with _hub_offline(os.environ.get("HF_HUB_OFFLINE", "1")), _weights_follow(_read_strictly(weights)):
            model, pre_train, pre_val = open_clip.create_model_and_transforms(name, **_act_kwargs(act), **kwargs)
            tokenizer = _tokenizer(name, cfg["model_cfg"].get("text_cfg", {}))
    except pickle.UnpicklingError as e:         # open_clip's torch.load(weights_only=True) refused the file
        raise refused_pickle(weights or name, e) from None
    _channels_last_input(model)
    model_cfg = {**cfg["model_cfg"], "quick_gelu": act, "nonscalar_logit_scale": kwargs["nonscalar_logit_scale"]}
    return Bundle(model, pre_train, pre_val, tokenizer, model_cfg, cfg.get("preprocess_cfg", {}))


def _hub_files(repo: str) -> tuple[dict, Path]:
    """(``open_clip_config.json``, the weights file open_clip would read) of Hub repository ``repo``, from the
    Hugging Face cache only unless ``HF_HUB_OFFLINE=0``: open_clip itself, finding no weights, only warns and
    builds a randomly initialised model."""
    from open_clip.pretrained import download_pretrained_from_hf
    os.environ.setdefault("HF_HUB_OFFLINE", "1")   # look in the cache only; never hang on a download
    try:
        with _hub_offline(os.environ["HF_HUB_OFFLINE"]):
            cfg = json.loads(Path(download_pretrained_from_hf(repo, filename=CONFIG_FILE)).read_text())
            weights = Path(download_pretrained_from_hf(repo))
    except Exception as e:
        raise FileNotFoundError(
            f"'{HF_HUB}{repo}' is not in the Hugging Face cache (looked for {CONFIG_FILE} and open_clip's weights "
            f"file under {_hub_cache()}). Download it on a machine with access (huggingface_hub.snapshot_download"
            f"('{repo}')) and copy the cache, set HF_HUB_OFFLINE=0 to let open_clip fetch it, or pass local-dir:DIR "
            f"({type(e).__name__})") from None
    if "model_cfg" not in cfg:
        raise ValueError(f"'{HF_HUB}{repo}': its {CONFIG_FILE} has no model_cfg; it is not an open_clip model")
    return cfg, weights


def _hub_cache() -> str:
    import huggingface_hub.constants as hub
    return hub.HF_HUB_CACHE


def _act_kwargs(act: bool) -> dict:
    # force_quick_gelu sets the config open_clip checks a tag against (no mismatch warning once we agree)
    return {"force_quick_gelu": True} if act else {"quick_gelu": False}


# what OpenAI's TorchScript archives hold besides the weights (open_clip's load_state_dict drops them too)
OPENAI_JIT_BUFFERS = ("input_resolution", "context_length", "vocab_size")


def activation(model: torch.nn.Module) -> str:
    """The MLP activation of the model's open_clip transformer blocks: ``quick_gelu``, ``gelu`` (or
    ``gelu_tanh``), per tower (``v:...,t:...``) where the towers differ, ``unknown`` with no such block
    (timm or Hugging Face towers, which keep their own)."""
    from open_clip.transformer import QuickGELU
    found = {}
    for name, m in model.named_modules():
        act = getattr(getattr(m, "mlp", None), "gelu", None)
        if act is None:
            continue
        label = ("quick_gelu" if isinstance(act, QuickGELU) else
                 ("gelu_tanh" if getattr(act, "approximate", "none") == "tanh" else "gelu")
                 if isinstance(act, torch.nn.GELU) else type(act).__name__)
        found.setdefault(tower_of(name), set()).add(label)
    labels = set().union(*found.values()) if found else set()
    if len(labels) <= 1:
        return labels.pop() if labels else "unknown"
    return ",".join(f"{t}:{'+'.join(sorted(v))}" for t, v in sorted(found.items()))


def _quick_gelu_tags(arch: str) -> list[str]:
    """The tags of ``arch`` whose weights were trained with QuickGELU (open_clip's pretrained records)."""
    return [t for t in open_clip.list_pretrained_tags_by_model(arch)
            if open_clip.get_pretrained_cfg(arch, t).get("quick_gelu", False)]


def _file_quick_gelu(arch: str, path: str, named: bool, quick_gelu: bool | None) -> tuple[bool, dict | None]:
    """(QuickGELU?, the state dict when negft must load it itself) for a bare weights file (``build``, rule 4).

    The file is opened only the safe ways: safetensors, or ``torch.load(weights_only=True)``.
    """
    provenance, state = _file_provenance(path)
    if provenance != "openai-jit-dump":
        state = None            # open_clip loads the file itself
    if quick_gelu is not None:
        return bool(quick_gelu), state
    if provenance == "openai-jit-dump":
        return True, state
    if named or provenance == "negft" or not _quick_gelu_tags(arch):
        return named, state
    twin = f"{arch}-quickgelu"
    raise ConfigError(
        f"'{path}' does not say whether its weights were trained with QuickGELU or GELU, and {arch} has both "
        f"kinds (QuickGELU: {', '.join(_quick_gelu_tags(arch))}; {arch} builds GELU). OpenAI's weights, "
        f"LAION-400M's and models fine-tuned from them (NegCLIP, ...) need QuickGELU; the wrong one loads "
        f"silently and costs accuracy. Say which: model.quick_gelu=true|false"
        + (f" (or model.arch={twin} for QuickGELU)" if twin in open_clip.list_models() else "")
        + ", or pass the weights as a local-dir whose open_clip_config.json records quick_gelu.")


def _file_provenance(path: str) -> tuple[str, dict | None]:
    """Where a bare weights file comes from, by what its layout records: ``openai-jit-dump`` (a state dict
    with OpenAI's TorchScript buffers), ``negft`` (a 1-element ``logit_scale``: negft builds every model so,
    OpenAI's and open_clip's are 0-d) or ``unknown``; with the state dict where it was read whole (a
    safetensors file is judged by its header alone; big_vision ``.npz`` weights, SigLIP's, by nothing).

    An OpenAI TorchScript archive (``ViT-B-32.pt`` as OpenAI releases it) is refused: reading it means
    ``torch.jit.load``, which runs the code inside it.
    """
    if Path(path).suffix in (".npz", ".npy"):
        return "unknown", None
    if str(path).endswith(".safetensors"):
        from safetensors import safe_open
        with safe_open(path, framework="pt") as f:
            keys = set(f.keys())
            scale = f.get_slice("logit_scale").get_shape() if "logit_scale" in keys else None
        state = None
        if all(k in keys for k in OPENAI_JIT_BUFFERS):
            from safetensors.torch import load_file
            state = load_file(path)
    else:
        if _is_torchscript(path):
            raise ConfigError(
                f"'{path}' is a TorchScript archive (the format of OpenAI's CLIP release); negft does not read "
                f"those, since torch.jit.load runs the code inside. Pass model.pretrained=openai (the same "
                f"weights, from the Hugging Face cache) or convert the archive once on a machine you trust, "
                f"e.g. safetensors.torch.save_file(open_clip.load_openai_model(PATH, device='cpu', "
                f"precision='fp32').state_dict(), 'openai.safetensors'), then pass that file with "
                f"model.quick_gelu=true.")
        import pickle
        try:
            try:
                obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError:            # an old-format (non-zip) file cannot be memory-mapped
                obj = torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as e:
            raise refused_pickle(path, e) from None
        state = obj["state_dict"] if isinstance(obj, dict) and "state_dict" in obj else obj
        if not isinstance(state, dict) or not state:
            raise ConfigError(f"'{path}' holds no state dict (got {type(state).__name__})")
        if next(iter(state)).startswith("module"):
            state = {k[7:]: v for k, v in state.items()}
        keys = set(state)
        scale = tuple(state["logit_scale"].shape) if "logit_scale" in keys else None
    if "visual.proj" in keys or "visual.attnpool.c_proj.weight" in keys:        # OpenAI's ViT / ResNet CLIP
        if all(k in keys for k in OPENAI_JIT_BUFFERS):
            return "openai-jit-dump", state
    if scale is not None and len(scale) == 1:
        return "negft", state
    return "unknown", state


def refused_global(error: Exception) -> str:
    """What torch.load(weights_only=True) stopped at, as its message names it (" (GLOBAL io.open refused)"), or
    ""."""
    import re
    found = re.search(r"GLOBAL \S+|Unsupported operand \d+|Unsupported class \S+", str(error))
    return f" ({found.group(0).rstrip('.,')} refused)" if found else ""


def refused_pickle(path, error: Exception) -> ConfigError:
    """negft's refusal of a weights file whose pickle holds more than tensors (code, or objects that run code
    when loaded): torch.load(weights_only=True) stopped at it, so nothing in it ran."""
    hint = refused_global(error)
    return ConfigError(
        f"'{path}' is a pickle that holds more than tensors{hint}; negft loads weights only, never code "
        f"from a file, so it was not loaded and nothing in it ran. Pass the weights as safetensors instead: a "
        f".safetensors file, or local-dir:DIR holding open_clip_config.json + open_clip_model.safetensors (what "
        f"negft's checkpoints and releases are). If you trust where the file came from, convert it once on a "
        f"machine you trust: safetensors.torch.save_file(torch.load(PATH, weights_only=False)['state_dict'], "
        f"'weights.safetensors').")


def _local_weights(folder: Path) -> Path | None:
    """The weights file open_clip reads from a local-dir, by its own preference (safetensors first)."""
    for name in ("open_clip_model.safetensors", "open_clip_pytorch_model.safetensors", "open_clip_pytorch_model.bin",
                 "open_clip_pytorch_model.pth", "model.safetensors", "pytorch_model.bin", "pytorch_model.pth",
                 "model.pth"):
        if (folder / name).is_file():
            return folder / name
    return None


def _is_torchscript(path: str) -> bool:
    """Whether ``path`` is a TorchScript archive (torch.load's own test: a zip with ``constants.pkl``)."""
    import zipfile
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as z:
        return any(n == "constants.pkl" or n.endswith("/constants.pkl") for n in z.namelist())


def _load_openai_dump(model: torch.nn.Module, state: dict) -> None:
    """Load a state dict saved from OpenAI's TorchScript model: its buffers dropped, as open_clip drops
    them from the archive itself, and ``logit_scale`` shaped as the model's."""
    state = {k: v for k, v in state.items() if k not in OPENAI_JIT_BUFFERS}
    if state["logit_scale"].shape != model.logit_scale.shape:
        state["logit_scale"] = state["logit_scale"].reshape(model.logit_scale.shape)
    model.load_state_dict(state, strict=True)


# torch.nn.init's random initialisers (what transformers' ``no_init_weights`` turns off too)
RANDOM_INITS = ("uniform_", "normal_", "trunc_normal_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_",
                "kaiming_normal_", "orthogonal_")


def _read_strictly(weights: str | Path | None) -> bool:
    """Whether a weights file fills every parameter and buffer of the model built for it: open_clip loads a
    state dict with ``strict=True`` (and ``_load_openai_dump`` too); big_vision's ``.npz``/``.npy`` go through
    open_clip's converter, which this does not vouch for."""
    return weights is not None and Path(weights).suffix not in (".npz", ".npy")


@contextlib.contextmanager
def _weights_follow(skip: bool):
    """Build without drawing random weights when every weight is read from a file right after (``skip``): open_clip
    initialises each parameter first (building ViT-B-32 on one thread here: 1.6–1.7 CPU-s with, 0.25–0.31 s
    without; negft-tiny draws its 6.3M-row token embedding twice), and the strict load overwrites all of it. Until
    the load the parameters hold whatever memory they were given."""
    saved = {name: getattr(torch.nn.init, name) for name in RANDOM_INITS} if skip else {}
    try:
        for name in saved:
            setattr(torch.nn.init, name, lambda tensor, *args, **kwargs: tensor)
        yield
    finally:
        for name, init in saved.items():
            setattr(torch.nn.init, name, init)


def _channels_last_input(model: torch.nn.Module) -> None:
    """Feed a ResNet image tower channels-last images: oneDNN's convolutions run about a fifth faster on CPU
    that way (negft-tiny-rn, batch 128, forward + backward: 0.47 s against 0.59 s). The weights keep their
    layout, which DeepSpeed's broadcast and the checkpoint files need."""
    if isinstance(model.visual, ModifiedResNet):
        model.visual.register_forward_pre_hook(
            lambda _, args: (args[0].contiguous(memory_format=torch.channels_last), *args[1:]))


@contextlib.contextmanager
def _hub_offline(value: str):
    """huggingface_hub reads HF_HUB_OFFLINE once, when it is imported (open_clip imports it first), so setting the
    variable later does not make it offline: a missing tag then spent about 45 s in retried HEAD requests to an
    unreachable hub before failing. Its module constant is what its HTTP layer checks on every request."""
    try:
        import huggingface_hub.constants as hub
    except ImportError:
        yield
        return
    before = hub.HF_HUB_OFFLINE
    hub.HF_HUB_OFFLINE = value.strip().upper() in {"1", "ON", "YES", "TRUE"}
    try:
        yield
    finally:
        hub.HF_HUB_OFFLINE = before


def _check_tag_cached(arch: str, tag: str, key: str = "model.pretrained") -> None:
    tags = open_clip.list_pretrained_tags_by_model(arch)
    if not open_clip.get_pretrained_cfg(arch, tag):
        near = difflib.get_close_matches(tag, tags, n=5, cutoff=0.4) or tags[:5]
        raise ValueError(f"pretrained '{tag}' is neither a file nor a known tag for {arch}"
                         + (f". Nearest tags: {', '.join(near)}" if near else " (it has no tags)")
                         + f" ({len(tags)} in all: open_clip.list_pretrained_tags_by_model('{arch}')). "
                         "Pass a tag, a checkpoint file, hf-hub:ORG/NAME or local-dir:DIR.")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")   # look in the cache only; never hang on a download
    cfg = open_clip.get_pretrained_cfg(arch, tag)
    try:
        from open_clip.pretrained import download_pretrained
        with _hub_offline(os.environ["HF_HUB_OFFLINE"]):
            download_pretrained(cfg)
    except Exception as e:
        raise FileNotFoundError(
            f"weights for {arch} pretrained='{tag}' are not in the local cache "
            f"(looked for hf-hub '{cfg.get('hf_hub', '')}' / url '{cfg.get('url', '')}' under "
            f"{os.environ.get('HF_HOME', '~/.cache/huggingface')}). Download them on a machine with access, "
            f"or pass the file: {key}=/path/to/weights.safetensors (or {key}=local-dir:DIR). ({e})") from None


def write_local_dir(model: torch.nn.Module, out: str | Path, model_cfg: dict, preprocess_cfg: dict | None = None,
                    extra: dict | None = None, state: dict | None = None) -> None:
    """Write weights (fp32 safetensors) and ``open_clip_config.json`` into the directory ``out``.

    ``state`` overrides entries of ``model.state_dict()`` (e.g. fp32 master copies of bf16 weights). A model with
    LoRA adapters is written merged, under open_clip's own keys (``lora.plain_state``).
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    # LoRA adapters are merged: what is written loads in plain open_clip, without peft
    state = lora.plain_state(model, state) if lora.has_adapters(model) else {**model.state_dict(), **(state or {})}
    state = {k: v.detach().to("cpu", torch.float32 if v.is_floating_point() else v.dtype).contiguous()
             for k, v in state.items()}
    save_file(state, str(out / WEIGHTS_FILE))
    as_umask_allows(out / WEIGHTS_FILE)        # safetensors writes 0600
    cfg = {"model_cfg": model_cfg, "preprocess_cfg": preprocess_cfg or {}}
    if extra:
        cfg["negft"] = extra
    (out / CONFIG_FILE).write_text(json.dumps(cfg, indent=2))


def negft_info(path: str | Path) -> dict:
    """The ``negft`` block a checkpoint directory's ``open_clip_config.json`` records ({} if none)."""
    f = Path(path) / CONFIG_FILE
    return json.loads(f.read_text()).get("negft", {}) if f.exists() else {}


def run_dir_of(ckpt: str | Path, info: dict | None = None) -> Path | None:
    """The training run a checkpoint came from (a patched model: its fine-tuned checkpoint's run), as the
    ``run_dir`` of its ``negft`` block records it; for a checkpoint written before that was recorded, or a run
    directory moved since, the folder two levels up (``RUN/checkpoints/epoch_N``). None where neither is a
    run directory (holds ``config.yaml``)."""
    info = negft_info(ckpt) if info is None else info
    source = Path(info["finetuned"]) if "patch" in info and info.get("finetuned") else Path(ckpt)
    candidates = ([Path(info["run_dir"])] if info.get("run_dir") else []) + [source.parent.parent]
    return next((run for run in candidates if (run / "config.yaml").exists()), None)


def save(model: torch.nn.Module, out: str | Path, model_cfg: dict, preprocess_cfg: dict | None = None,
         extra: dict | None = None) -> Path:
    """Write ``out`` as an open_clip ``local-dir``, whole or not at all (``negft.io``: a failed write raises
    ``WriteError`` naming ``out``, and an old ``out`` is kept whole)."""
    with atomic_path(out, directory=True) as staged:
        write_local_dir(model, staged, model_cfg, preprocess_cfg, extra)
    return Path(out)


def towers(model: torch.nn.Module) -> dict[str, list[str]]:
    """Parameter names per tower (``tower_of``)."""
    out = {"v": [], "t": [], "shared": []}
    for name, _ in model.named_parameters():
        out[tower_of(name)].append(name)
    return out


def set_trainable(model: torch.nn.Module, tower: str, train_logit_scale: bool,
                  text_unlocked: int | None = None, frozen: list[str] = ()) -> None:
    """Freeze what ``tower`` (v | t | vt) does not train; ``logit_scale`` follows its own key. ``text_unlocked``
    (N, not None): of the text tower, only open_clip's last N groups train (``lock_text_tower``). A text tower
    with LoRA adapters (``lora.inject``) trains through them only. ``frozen``: parameter names or module
    prefixes frozen on top (``model.frozen``); ValueError naming one that matches no parameter."""
    groups = towers(model)
    trainable = set()
    if "v" in tower:
        trainable.update(groups["v"])
    if "t" in tower:
        trainable.update([n for n in groups["t"] if lora.is_adapter(n)] or groups["t"])
    if train_logit_scale:
        trainable.update(groups["shared"])
    for name, p in model.named_parameters():
        p.requires_grad_(name in trainable)
    if "t" in tower and text_unlocked is not None:
        from open_clip.transformer import lock_text_tower
        lock_text_tower(model, text_unlocked)     # the text tower's own parameters only
    names = [n for n, _ in model.named_parameters()]
    for prefix in frozen:
        hits = [n for n in names if n == prefix or n.startswith(prefix + ".")]
        if not hits:
            near = difflib.get_close_matches(prefix, sorted({n.rsplit(".", 1)[0] for n in names} | set(names)), 3)
            raise ValueError(f"model.frozen: '{prefix}' names no parameter of this model"
                             + (f" (nearest: {', '.join(near)})" if near else ""))
        for n in hits:
            model.get_parameter(n).requires_grad_(False)


def train_mode(model: torch.nn.Module, tower: str, freeze_norm_stats: bool = False) -> None:
    """Training mode for the towers that ``tower`` trains, eval mode for a frozen one, and for every batch norm
    with ``freeze_norm_stats`` (``model.freeze_norm_stats``).

    A frozen tower must stay fixed: in training mode the batch-norm layers of a conv image tower would
    normalise by batch statistics and keep updating their running statistics.
    """
    model.train()
    for name, child in model.named_children():
        if tower_of(name) not in tower:
            child.eval()
    if freeze_norm_stats:
        for module in model.modules():
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
                module.eval()


def _plain_blocks(transformer) -> bool:
    """open_clip's own residual blocks, batch first: ``encode_text_trimmed`` may run them one by one."""
    from open_clip.transformer import ResidualAttentionBlock
    return transformer.batch_first and all(type(r) is ResidualAttentionBlock and not hasattr(r, "ln_1_kv")
                                           for r in transformer.resblocks)


def _causal_block(r, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    y = r.ln_1(x)
    x = x + r.ls_1(r.attn(y, y, y, need_weights=False, attn_mask=mask)[0])
    return x + r.ls_2(r.mlp(r.ln_2(x)))


def _causal_blocks(transformer, blocks, x: torch.Tensor) -> torch.Tensor:
    """open_clip's ``ResidualAttentionBlock.forward`` with a boolean causal mask, checkpointed as the
    transformer says.

    Without gradients this is PyTorch's fused attention (``nn.MultiheadAttention``'s fast path), which takes
    boolean masks only; open_clip's block casts its float mask to the activations' dtype, which disables it.
    Evaluation is mostly text encoding, and the world probes' texts encode about 16% faster this way. Same
    sums as the block up to float rounding.
    """
    from torch.utils.checkpoint import checkpoint
    n = x.shape[1]
    mask = torch.ones(n, n, dtype=torch.bool, device=x.device).triu(1)      # True: may not attend
    checkpointed = transformer.grad_checkpointing and torch.is_grad_enabled()
    for r in blocks:
        x = checkpoint(_causal_block, r, x, mask, use_reentrant=False) if checkpointed else _causal_block(r, x, mask)
    return x


def _pooled_block(r, x: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """The last block computed at the pooled (end-of-text) positions only: (B, n, D) -> (B, D).

    Nothing reads its output anywhere else, so attention keys and values are all it needs from the other
    positions. That skips about five sixths of the block's work: a quarter of negft-tiny's three-layer text
    tower, a twelfth of ViT-B-32's, in training and in evaluation."""
    rows = torch.arange(x.shape[0], device=x.device)
    y = r.ln_1(x)
    after_end = torch.arange(x.shape[1], device=x.device) > ends[:, None]       # True: may not attend
    a = r.attn(y[rows, ends].unsqueeze(1), y, y, need_weights=False, key_padding_mask=after_end)[0]
    h = x[rows, ends] + r.ls_1(a.squeeze(1))
    return h + r.ls_2(r.mlp(r.ln_2(h)))


def _trims(model) -> bool:
    """Whether ``encode_text_trimmed`` trims ``model``'s texts (open_clip's causal ``CLIP`` text tower)."""
    from open_clip.model import CLIP
    return isinstance(model, CLIP) and model.attn_mask is not None and model.text_pool_type in ("argmax", "eos")


def _text_ends(model, tokens: torch.Tensor) -> torch.Tensor:
    """Each row's pooled (end-of-text) position."""
    return tokens.argmax(-1) if model.text_pool_type == "argmax" else (tokens == model.text_eos_id).int().argmax(-1)


def trim_width(model, tokens: list[torch.Tensor]) -> int | None:
    """The width ``encode_text_trimmed`` cuts the rows of ``tokens`` (token tensors, the last dimension the
    context) to when they are encoded together: their last end-of-text position + 1; None where it does not trim.
    Given the host's copy of a batch's tokens, the host knows it without reading the device."""
    rows = [t.reshape(-1, t.shape[-1]) for t in tokens]
    rows = [t for t in rows if t.shape[0]]
    if not _trims(model) or not rows:
        return None
    return max(int(_text_ends(model, t).max()) for t in rows) + 1


def _embedded(model, tokens: torch.Tensor, width: int | None):
    """(tokens cut to ``width`` or to their last end-of-text token, each row's end-of-text position, their token and
    position embeddings in the tower's dtype): what both trimmed encoders start from."""
    ends = _text_ends(model, tokens)
    n = int(ends.max()) + 1 if width is None else width
    tokens = tokens[:, :n]
    cast = model.transformer.get_cast_dtype()
    return tokens, ends, model.token_embedding(tokens).to(cast) + model.positional_embedding[:n].to(cast)


def encode_text_trimmed(model, tokens: torch.Tensor, width: int | None = None) -> torch.Tensor:
    """``model.encode_text(tokens)`` computed on the tokens up to the batch's last end-of-text token.

    Exact for open_clip's ``CLIP`` text tower, which is causal and pooled at the end-of-text token: no
    position it reads attends to the padding after it, and the padding gets no gradient either way. Captions
    and probe texts fill about a third of the context, so this cuts the text tower's cost severalfold in
    training and evaluation. With open_clip's plain blocks the last one runs at the pooled positions only
    (``_pooled_block``). Any other model is encoded untrimmed.

    ``width``: that cut (``trim_width``) where the caller knows it, computed from the host's copy of the tokens;
    else it is read from ``tokens``, which on a GPU waits for the device.
    """
    from open_clip.transformer import text_global_pool
    if not _trims(model):
        return model.encode_text(tokens)
    tokens, ends, x = _embedded(model, tokens, width)
    n = tokens.shape[1]
    if _plain_blocks(model.transformer):
        x = _causal_blocks(model.transformer, model.transformer.resblocks[:-1], x)
        x = model.ln_final(_pooled_block(model.transformer.resblocks[-1], x, ends))
    else:
        x = model.transformer(x, attn_mask=model.attn_mask[:n, :n])
        x = model.ln_final(x)
        x = text_global_pool(x, tokens, model.text_pool_type, eos_token_id=getattr(model, "text_eos_id", None))
    proj = model.text_projection
    if proj is None:
        return x
    return proj(x) if isinstance(proj, torch.nn.Linear) else x @ proj


TEXT_GROUPS = 4     # most groups encode_text_grouped splits a batch into


def length_groups(ends: list[int], most: int = TEXT_GROUPS) -> list[list[int]]:
    """The rows of a batch (``ends``: each row's end-of-text position) in at most ``most`` groups of similar
    length, shortest first, chosen to encode the fewest token positions: each group costs its rows times its
    longest row. Exact by dynamic programming over the distinct lengths (at most the context's)."""
    widths = sorted(set(ends))
    count = {w: 0 for w in widths}
    for e in ends:
        count[e] += 1
    m = len(widths)
    prefix = [0]
    for w in widths:
        prefix.append(prefix[-1] + count[w])
    # best[k][b]: (positions, cut) of the first b widths in k groups, the last group starting after width `cut`
    inf = float("inf")
    best = [[(inf, 0)] * (m + 1) for _ in range(most + 1)]
    best[0][0] = (0, 0)
    for k in range(1, most + 1):
        for b in range(1, m + 1):
            best[k][b] = min(((best[k - 1][a][0] + (prefix[b] - prefix[a]) * (widths[b - 1] + 1), a)
                              for a in range(b) if best[k - 1][a][0] < inf), default=(inf, 0))
    k = min(range(1, most + 1), key=lambda k: (best[k][m][0], k))
    cuts, b = [], m
    while k:
        a = best[k][b][1]
        cuts.append((widths[a], widths[b - 1]))
        b, k = a, k - 1
    order = sorted(range(len(ends)), key=lambda i: ends[i])
    return [[i for i in order if lo <= ends[i] <= hi] for lo, hi in reversed(cuts)]


def encode_text_grouped(model, tokens: torch.Tensor, host: torch.Tensor | None = None) -> torch.Tensor:
    """``encode_text_trimmed`` over groups of rows of similar length (``length_groups``), each cut to its own
    longest row, the features put back in the rows' order: on a CPU, where a step's time is its arithmetic.

    A training step's texts mix short MCQ options with long negated captions, and one long row sets the width
    of all: the demo's 448 texts a step ran at about 29 positions each against a mean of 11. Each row's features
    are what ``encode_text_trimmed`` gives it (the tower is causal and pooled at the end-of-text token), up to
    float rounding. On a GPU (and under ``torch.compile``) this is ``encode_text_trimmed``: there a batch's rows
    cost little more than its launches. ``host``: the host's copy of ``tokens``, where the caller has it: the
    groups and widths are read there, not from ``tokens`` (a step reads nothing back from its device).
    """
    lengths = tokens if host is None else host
    if tokens.device.type != "cpu" or not _trims(model) or torch.compiler.is_compiling() or tokens.shape[0] < 2:
        return encode_text_trimmed(model, tokens, None if host is None else trim_width(model, [host]))
    ends = _text_ends(model, lengths).tolist()
    groups = length_groups(ends)
    feats = torch.cat([encode_text_trimmed(model, tokens[torch.tensor(g)], max(ends[i] for i in g) + 1)
                       for g in groups])
    return feats[torch.tensor([i for g in groups for i in g]).argsort()]      # back in the rows' order


def encode_text_tokens(model, tokens: torch.Tensor, width: int | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(pooled features, every position's features, their mask) of open_clip's causal ``CLIP`` text tower, trimmed
    as ``encode_text_trimmed`` trims: each position after ``ln_final`` and the projection (FSC-CLIP's token
    features), pooled at the end-of-text token; the mask keeps the caption's tokens and its end-of-text token, not
    the start token or the padding. The pooled features are ``encode_text_trimmed``'s up to float rounding."""
    if not _trims(model):
        raise ValueError(f"token features need open_clip's CLIP text tower, not {type(model).__name__}'s")
    tokens, ends, x = _embedded(model, tokens, width)
    n = tokens.shape[1]
    if _plain_blocks(model.transformer):
        x = _causal_blocks(model.transformer, model.transformer.resblocks, x)
    else:
        x = model.transformer(x, attn_mask=model.attn_mask[:n, :n])
    x = model.ln_final(x)
    proj = model.text_projection
    if proj is not None:
        x = proj(x) if isinstance(proj, torch.nn.Linear) else x @ proj
    mask = tokens > 0
    mask[:, 0] = False
    return x[torch.arange(x.shape[0], device=x.device), ends], x, mask


def encode_image_tokens(model, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(pooled features, patch features) of open_clip's ViT image tower: the patch tokens after ``ln_post``
    without the class token, projected as the pooled feature is (FSC-CLIP's). A conv tower has no patch tokens."""
    from open_clip.transformer import VisionTransformer
    visual = model.visual
    if not isinstance(visual, VisionTransformer):
        raise ValueError(f"patch features need a ViT image tower, not {type(visual).__name__} (loss.fscclip.w_local > 0 "
                         "reads them: choose a ViT model or set loss.fscclip.w_local=0)")
    kept = visual.output_tokens
    visual.output_tokens = True
    try:
        pooled, patches = visual(images)
    finally:
        visual.output_tokens = kept
    return pooled, (patches @ visual.proj if visual.proj is not None else patches)
