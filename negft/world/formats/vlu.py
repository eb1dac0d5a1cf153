"""The world's VLU ("Is BERT blind?") files in the layout of the paper's repository (negft.data.layout_vlu;
TAU-VAILab/isbertblind ``datasets/shape_association.csv``, ``configs/shapes.json``, ``utils/setup_utils.py``).

- ``datasets/shape_association.csv`` (ShapeIt's columns ``word, gt, options``): which shape a setting suggests,
  from the world's own context priors (negft.world.generator.CONTEXT_PRIORS; the words are the setting phrases its
  captions use, "on the beach"). ``gt`` is the setting's most likely shape; ShapeIt has one right shape per word,
  so where a prior ties at the top (beach: star and circle; night: star and crescent) the first of them (in the
  world's shape order) is ``gt`` and the others are left out of that word's options.
- ``configs/shapes.json``: the prompts for these words (a setting phrase follows the shape: "a MASK WORD").
- ``datasets/color_association.csv`` (same columns): the colour a setting's backdrop shows (sand: yellow, grass:
  green, night sky: black, snow: white, a room's wooden floor: brown; negft.world.render.BACKGROUNDS),
  options the paper's nine colours; words are the setting phrases without their preposition and article
  ("grass", "snowy field"; "indoors" has none and is left out).

No concreteness ratings: the world has none. Nothing here is random.
"""
from __future__ import annotations

import csv
import json
import re
from pathlib import Path

from negft.data import layout_vlu
from negft.world.generator import CONTEXT_PRIORS
from negft.world.render import SHAPES
from negft.phrasings import BACKGROUND_PHRASES

SHAPE_PROMPTS = ("a MASK WORD", "a photo of a MASK WORD", "there is a MASK WORD", "a drawing of a MASK WORD",
                 "a picture of a MASK WORD")
PAPER_COLORS = ("red", "orange", "yellow", "green", "blue", "black", "white", "grey", "brown")
BACKDROP_COLOR = {"beach": "yellow", "grass": "green", "night": "black", "snow": "white", "room": "brown"}


def shape_rows() -> list[tuple[str, str, list[str]]]:
    rows = []
    for bg, weights in CONTEXT_PRIORS.items():
        top = max(weights)
        tops = [s for s, w in zip(SHAPES, weights) if w == top]
        options = [s for s in SHAPES if s not in tops[1:]]
        rows += [(phrase, tops[0], options) for phrase in BACKGROUND_PHRASES[bg]]
    return rows


def color_rows() -> list[tuple[str, str, list[str]]]:
    rows = []
    for bg, phrases in BACKGROUND_PHRASES.items():
        for phrase in phrases:
            m = re.match(r"(?:on|in|against) (?:the|a) (.+)", phrase)
            if m:
                rows.append((m.group(1), BACKDROP_COLOR[bg], list(PAPER_COLORS)))
    return rows


def _write_choice(path: Path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f, quoting=csv.QUOTE_ALL)
        w.writerow(layout_vlu.CHOICE_COLUMNS)
        w.writerows([word, gt, repr(options)] for word, gt, options in rows)


def _write_config(path: Path, name: str, dataset: str, prompts) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"setup_params": {"experiment_name": name, "output_dir": "./output/",
                                                 "dataset_path": f"./{dataset}", "task": "choice"},
                                "prompts": list(prompts), "models": []}, indent=2))


def write(split_dir: Path, main: list[dict], zeroshot: list[dict], seed: int) -> None:
    _write_choice(split_dir / layout_vlu.SHAPE_CSV, shape_rows())
    _write_config(split_dir / layout_vlu.SHAPE_CONFIG, "shapes_association", layout_vlu.SHAPE_CSV, SHAPE_PROMPTS)
    _write_choice(split_dir / layout_vlu.COLOR_CSV, color_rows())
