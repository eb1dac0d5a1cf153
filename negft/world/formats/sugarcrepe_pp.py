"""The world's probe images as SugarCrepe++'s five splits, in its released layout (Sri-Harsha/scpp
``data/<split>.json``: a list of ``{"id", "filename", "caption", "caption2", "negative_caption"}``, written as
pandas writes it: indented by 1, no space after ``:``, no final line break).

Where the files sit: ``data/<split>.json`` in the split folder, as under the manifest's root
(``$NEGFT_DATA/sugarcrepe_pp/data/``; the split's ``data/`` also holds Probe-R/C/B's folders, which no SugarCrepe++
reader looks at); ``filename`` is a file name in ``images/`` beside ``data/``, the folder the reference's evaluation
opens (the split's ``images/`` is the world's own image folder, so nothing is copied).

Per probe image, one row per split where the scene allows it, built as SugarCrepe's writer builds its caption
and negative (``negft.world.formats.sugarcrepe``), plus a second true caption that says the same in other
words, as SugarCrepe++'s ``caption2`` does:

- object lists (replace_obj, replace_att, and swap_att where no related pair differs in colour): ``caption`` and
  the negative use one held-out affirmative template that names the setting, one phrase for the setting and
  one object order; ``caption2`` the other such template, the background's other phrase ("in the snow", "on a
  snowy field") and the objects in reverse order.
- a relation (replace_rel, swap_obj, swap_att): ``caption`` "A red star positioned to the left of a blue circle";
  ``caption2`` the converse, "A blue circle positioned to the right of a red star", which holds whenever the
  relation does (the world's relations are computed both ways).

The negative is false of the scene as SugarCrepe's is. Randomness: ``formats.rng(seed, split_dir,
"sugarcrepe_pp")`` only.
"""
from __future__ import annotations

import json
from pathlib import Path

from negft import phrasings
from negft.world import formats
from negft.world.formats.sugarcrepe import ATTRIBUTES, _capital, _pick, phrase
from negft.world.render import SHAPES

SPLITS = ("replace_att", "replace_obj", "replace_rel", "swap_att", "swap_obj")
KEYS = ("id", "filename", "caption", "caption2", "negative_caption")
DATA = "data"
# the held-out affirmative templates that name the setting: both positives say where the objects are
SETTING_TEMPLATES = tuple(t for t in phrasings.AFFIRM_HELD_OUT if "{bg}" in t)


def examples(scene: dict, rng) -> dict[str, tuple[str, str, str]]:
    """split -> (caption, caption2, negative_caption) for one scene; a split the scene does not allow is absent."""
    objs, rels = scene["objects"], scene["relations"]
    order = [int(i) for i in rng.permutation(len(objs))]
    first, second = rng.permutation(SETTING_TEMPLATES).tolist()[:2]
    bg_first, bg_second = rng.permutation(phrasings.BACKGROUND_PHRASES[scene["background"]]).tolist()[:2]
    absent = [s for s in SHAPES if s not in {o["shape"] for o in objs}]

    def listed(true: list[str], false: list[str]) -> tuple[str, str, str]:
        """The true list in one template, reversed in the other; the false list as the first."""
        def fill(template: str, bg: str, phrases: list[str]) -> str:
            return _capital(template.format(objs=phrasings.join_list(phrases), bg=bg))
        return fill(first, bg_first, true), fill(second, bg_second, true[::-1]), fill(first, bg_first, false)

    def related(subj: dict, pred: str, obj: dict, false: tuple[dict, str, dict]) -> tuple[str, str, str]:
        """The relation, its converse, and the false one, in the held-out RelComp template."""
        say = lambda s, p, o: phrasings.relcomp_caption(s, p, o, phrasings.RELCOMP_HELD_OUT[0])  # noqa: E731
        return say(subj, pred, obj), say(obj, phrasings.OPPOSITE[pred], subj), say(*false)

    def wrong(obj: dict, attr: str) -> str:
        return _pick(rng, [v for v in ATTRIBUTES[attr] if v != obj[attr]])

    out = {}
    colour = [phrase(objs[i]) for i in order]
    k, attr = int(rng.random() * len(objs)), _pick(rng, tuple(ATTRIBUTES))
    target = objs[order[k]]
    out["replace_att"] = listed(colour[:k] + [phrase(target, (attr,))] + colour[k + 1:],
                                colour[:k] + [phrase({**target, attr: wrong(target, attr)}, (attr,))] + colour[k + 1:])
    k = int(rng.random() * len(objs))
    target = objs[order[k]]
    out["replace_obj"] = listed(colour, colour[:k] + [phrase({**target, "shape": _pick(rng, absent)})] + colour[k + 1:])
    if rels:
        i, pred, j = _pick(rng, rels)
        out["replace_rel"] = related(objs[i], pred, objs[j], (objs[i], phrasings.OPPOSITE[pred], objs[j]))
        i, pred, j = _pick(rng, rels)
        out["swap_obj"] = related(objs[i], pred, objs[j], (objs[j], pred, objs[i]))
    two_colours = [r for r in rels if objs[r[0]]["color"] != objs[r[2]]["color"]]
    if two_colours:
        i, pred, j = _pick(rng, two_colours)
        a, b = objs[i], objs[j]
        out["swap_att"] = related(a, pred, b, ({**a, "color": b["color"]}, pred, {**b, "color": a["color"]}))
    else:
        pairs = [(i, j) for i in order for j in order if i < j and objs[i]["color"] != objs[j]["color"]]
        if pairs:
            i, j = _pick(rng, pairs)
            a, b = objs[i], objs[j]
            out["swap_att"] = listed([phrase(a), phrase(b)],
                                     [phrase({**a, "color": b["color"]}), phrase({**b, "color": a["color"]})])
    return out


def write_split(path: Path, rows: list[dict]) -> None:
    """One split file in the released layout: a list of rows with integer ids from 0, in the release's
    formatting."""
    data = [{"id": i, **{k: r[k] for k in KEYS[1:]}} for i, r in enumerate(rows)]
    Path(path).write_text(json.dumps(data, indent=1, separators=(",", ":"), ensure_ascii=False), encoding="utf-8")


def write(split_dir: Path, main: list[dict], zeroshot: list[dict], seed: int) -> None:
    rng = formats.rng(seed, split_dir, "sugarcrepe_pp")
    rows: dict[str, list[dict]] = {s: [] for s in SPLITS}
    for rec in main:
        filename = str(Path(rec["image_path"]).relative_to("images"))
        for split, (caption, caption2, negative) in examples(rec["scene"], rng).items():
            rows[split].append({"filename": filename, "caption": caption, "caption2": caption2,
                                "negative_caption": negative})
    (Path(split_dir) / DATA).mkdir(exist_ok=True)
    for split in SPLITS:
        write_split(Path(split_dir) / DATA / f"{split}.json", rows[split])
