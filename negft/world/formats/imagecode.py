"""The world's probe images as ImageCoDe, in the released layout (McGill-NLP/imagecode ``data/valid_data.json`` and
``image-sets.zip``; see ``negft.probes.imagecode``): at the top of the split folder, as under the manifest's root
(``$NEGFT_DATA/imagecode/``),

- ``image-sets/<set folder>/img<N>.jpg``: sets of ten consecutive probe images, JPEG copies. Sets alternate
  between video-like folders (``MSR-VTT-videoTrainValVideo_video<k>-shot1_0``, N the frame numbers ``FRAMES``,
  whose order by number is not their order as text) and static ones (``open-images-<k>_<hex>``, N 0 to 9);
- ``valid_data.json``: ``{set folder: {image index: description}}``, up to two described images a set (drawn), each
  description a relation ("a red star above a blue circle") or an object ("a red star") true of that image and of
  no other image of its set; the index is the image's position in the set ordered by N.

Randomness (which images are described): ``formats.rng(seed, split_dir, "imagecode")`` only.
"""
from __future__ import annotations

import json
import zlib
from pathlib import Path


from negft.text import with_article
from negft.world import formats
from negft.world.formats.svo_probes import desc, sentence

FILE, IMAGES, SET_SIZE, DESCRIBED = "valid_data.json", "image-sets", 10, 2
FRAMES = (0, 2, 5, 9, 12, 15, 20, 24, 30, 100)       # a video set's frame numbers: "img100" sorts before "img12"


def folder_name(k: int) -> str:
    if k % 2 == 0:
        return f"MSR-VTT-videoTrainValVideo_video{k}-shot1_0"
    return f"open-images-{k}_{zlib.crc32(str(k).encode()):08x}"


def descriptions(scene: dict) -> list[str]:
    """Phrases true of a scene: its relations, then its objects."""
    objects = scene["objects"]
    return ([sentence(desc(objects[i]), p, desc(objects[j])).lower() for i, p, j in scene["relations"]]
            + [with_article(desc(o)) for o in objects])


def true_of(scene: dict, text: str) -> bool:
    objects = scene["objects"]
    if text in [with_article(desc(o)) for o in objects]:
        return True
    return any(sentence(desc(objects[i]), p, desc(objects[j])).lower() == text for i, p, j in scene["relations"])


def unique_description(scenes: list[dict], target: int) -> str | None:
    for text in descriptions(scenes[target]):
        if not any(true_of(s, text) for k, s in enumerate(scenes) if k != target):
            return text
    return None


def write(split_dir: Path, main: list[dict], zeroshot: list[dict], seed: int) -> None:
    split_dir = Path(split_dir)
    rng = formats.rng(seed, split_dir, "imagecode")
    data = {}
    for k in range(len(main) // SET_SIZE):
        records = main[k * SET_SIZE:(k + 1) * SET_SIZE]
        folder = folder_name(k)
        frames = FRAMES if k % 2 == 0 else range(SET_SIZE)
        for rec, n in zip(records, frames):
            formats.copy_as_jpeg(split_dir / rec["image_path"], split_dir / IMAGES / folder / f"img{n}.jpg")
        scenes = [r["scene"] for r in records]
        described = {}
        for target in sorted(int(i) for i in rng.permutation(SET_SIZE)[:DESCRIBED]):
            text = unique_description(scenes, target)
            if text is not None:
                described[str(target)] = text
        if described:
            data[folder] = described
    (split_dir / FILE).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
