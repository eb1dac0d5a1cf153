"""``negft release``: a checkpoint as a publishable open_clip local-dir and Hub repository (``negft.release``), and
``push=`` to upload it. Its keys: ``ReleaseKeys``."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from negft.commands.keys import fail, help_text, key, outcome, parse, synopsis, wants_help
from negft.config import ConfigError
from negft.outdir import check_writable


@dataclass(kw_only=True)
class ReleaseKeys:
    """The keys of ``negft release``."""
    ckpt: str = key("", "a checkpoint directory (a run's checkpoints/epoch_N or a patch's selected/); empty with "
                        "push=: upload the release already in out")
    out: str = key(doc="a new folder (overwritten only with overwrite=true) for the weights, config, README.md (the model card) and "
                       "SHA256SUMS")
    license: str = key("other", "the card's Hub license id (mit, apache-2.0, ...); other: terms the card does not name")
    push: str = key("", "ORG/NAME: upload the release to that Hub model repository (created if absent) after "
                        "checking its SHA256SUMS; needs HF_TOKEN or `hf auth login`")
    private: bool = key(False, "true: a push creates the repository private")
    dry_run: bool = key(False, "true: list what push= would upload, upload nothing")
    overwrite: bool = key(False, "true: replace the release in out (without it an existing out is refused)")


WHAT = ("Copy a checkpoint into a new folder as a publishable open_clip local-dir and Hugging Face Hub repository "
        "(README.md model card with the Hub's metadata, checksums); push= uploads it.")
README = (("Patching and release", "what the release holds and how it is checked"),)


def synopses() -> list[tuple[str, str]]:
    return [(synopsis("negft release", ReleaseKeys, ("ckpt", "license", "push")),
             "safetensors + config + README.md card + SHA256SUMS; push: upload it to the Hub")]


def help_() -> str:
    return help_text(synopses(), WHAT, ReleaseKeys, README, "negft/commands/release.py, negft/release.py (release, "
                                                       "push_to_hub)")


def main(argv: list[str]) -> int:
    """``negft release ARGS``: release ``ckpt`` into ``out``; with ``push``, then upload ``out`` (without ``ckpt``:
    the release already in ``out``). 0 when done, 2 for bad input, 1 for a failed write."""
    if wants_help(argv):
        print(help_())
        return 0
    from negft.release import push_to_hub, release
    try:
        keys = parse(ReleaseKeys, argv)
        if not keys.ckpt and not keys.push:
            raise ConfigError("missing required key(s): ckpt=... (or push=ORG/NAME to upload the release in out)")
        if keys.ckpt:
            check_writable(keys.out)
    except ConfigError as e:
        return fail(str(e))

    def publish() -> None:
        if keys.ckpt:
            release(keys.ckpt, keys.out, keys.license, keys.overwrite)
        if keys.push:
            push_to_hub(keys.out, keys.push, keys.private, keys.dry_run)
    return outcome(publish, lambda _: f"[negft] release: {Path(keys.out)}")
