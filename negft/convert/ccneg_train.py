"""CC-Neg's fine-tuning split with its distractor images → shards for CoN-CLIP's objective (``recipe=conclip``).

    negft data convert ccneg-train CCNEG_PT COCO_CAPTIONS COCO_IMAGES out=DIR [mapping=FILE] [root=DIR]

Released layout (jaisidhsingh/CoN-CLIP @ 503388a: ``src/data/finetuning_datasets.py``
``FineTuningDatasetWithNegatives``, the dataset ``conclip_fine_tuning.py`` trains on with ``--negative-images=on``,
as ``src/run_finetuning.sh`` runs it; ``src/configs/__init__.py``; ``ccneg_dataset/README.md``). The files are on
Proton Drive (``distractor_image_mapping.pt`` is committed too, but the mirror read here lacks its bytes), so the
layout is the loader's:

- ``CCNEG_PT``, ``ccneg_preprocessed.pt``: the torch file the ccneg probe reads (negft/probes/ccneg.py documents it
  and reads it here, with ``weights_only=True``; its JSON conversion, ``negft data convert ccneg``, works too). The
  fine-tuning split is every row before the last 40,000 (``[:len - configs.num_ccneg_eval_samples]``; those are the
  evaluation split). Row i: the image ``image_paths[i]`` with ``/workspace/datasets/cc3m/`` replaced by the dataset
  folder ``root`` (``configs.ccneg_root_folder``; default: CCNEG_PT's folder, where the configs put the file), the
  caption ``annotations[i]["json"]["caption"]``, the negated caption ``annotations[i]["sop_data"]["negative-prompt"]``
  with its commas removed.
- ``mapping``, ``distractor_image_mapping.pt`` (default: beside CCNEG_PT): ``mapping[i][0]`` is row i's top-1
  distractor (``topk_indices = mapping[idx]; top1_index = topk_indices[0]``), an index into torchvision's
  ``CocoCaptions(root=COCO train2017 images, annFile=captions_train2017.json)``, whose item k is the image with the
  k-th smallest id of the captions file's ``images`` (torchvision ``CocoDetection``: ``ids = sorted(coco.imgs)``),
  read from ``COCO_IMAGES/<file_name>``. Read with ``weights_only=True`` (a tensor, list or dict), which runs no code.

One sample per usable fine-tuning row, keyed ``ccneg<row>``, its CC3M image and the distractor's bytes unchanged
(the ``neg.jpg`` member), as CoN-CLIP's loss (losses.CoNCLIPLoss) reads them:

    caption   the caption
    relcomp   {caption, negatives: [{text: the negated caption, kind: "negation"}], negative_image: "distractor",
              negative_image_caption: the negated caption (the third term pairs the distractor with it),
              negative_image_negatives: []}
    ccneg     {row, image: the path as released, distractor: {index, image_id, file_name}}

Skipped and counted in manifest.json, by reason: the probe's row reasons (an annotation that is not an object, a
caption or negated caption missing or empty, an image path that is not a string), a missing image, an image that is
not jpg/png, a row the mapping gives no integer distractor, a distractor index outside COCO's images, a missing
distractor image (or one not a jpg/png file). CoN-CLIP's loader has a distractor for every row, so a row without one
is skipped, not kept without it.

``negft.world.formats.ccneg_train.write`` writes a small example of these files from the world, bad rows planted.
"""
from __future__ import annotations

import json
import pickle
from pathlib import Path

import torch

from negft.convert.coco import BAD_TYPE
from negft.data.schema import CAPTION, RELCOMP
from negft.data.shards import IMAGE_EXTS, MISSING_IMAGE, ShardWriter, truthy
from negft.models import refused_global
from negft.probes import ccneg

LAYOUT_SOURCE = ("jaisidhsingh/CoN-CLIP @ 503388a: src/data/finetuning_datasets.py (FineTuningDatasetWithNegatives: "
                 "data = torch.load(ccneg_preprocessed.pt); rows [:len(image_paths) - 40000]; image_paths[i] with "
                 "'/workspace/datasets/cc3m/' replaced by the dataset folder; annotations[i]['json']['caption']; "
                 "annotations[i]['sop_data']['negative-prompt'].replace(',', ''); distractor "
                 "CocoCaptions(train2017, captions_train2017.json)[torch.load(distractor_image_mapping.pt)[i][0]]), "
                 "src/configs/__init__.py (num_ccneg_eval_samples = 40000; coco train2017 images and "
                 "captions_train2017.json), ccneg_dataset/README.md; torchvision CocoDetection (ids = "
                 "sorted(coco.imgs), image at <root>/<file_name>)")
MAPPING = "distractor_image_mapping.pt"
NEGATION = "negation"           # the kind of the negated caption
DISTRACTOR = "distractor"       # the kind of the negative image

# skip reasons (manifest.json's "skipped"), besides the probe's row reasons (negft.probes.ccneg.parse_row)
NO_DISTRACTOR = "no integer distractor in the mapping"
OUT_OF_RANGE = "distractor index outside COCO's images"
MISSING_DISTRACTOR = "missing distractor image"


def fine_tuning_rows(pt) -> list:
    """[(row, image path, annotation)] of CC-Neg's fine-tuning split; ValueError when the file cannot be read or
    has no such row."""
    data, why = ccneg.load(pt)
    rows = [("file", why)] if data is None else ccneg.rows_of(data, split="train")
    if rows and rows[0][0] == "file":
        raise ValueError(f"{pt}: {rows[0][1]}")
    if not rows:
        raise ValueError(f"{pt}: every row is in the evaluation split (its last {ccneg.EVAL_ROWS}): no fine-tuning "
                         "row to convert")
    return rows


def load_mapping(path):
    """The distractor mapping, loaded without running code; ValueError when it cannot be read."""
    try:
        mapping = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise ValueError(f"{path}: torch.load(weights_only=True) stopped at an object it does not load"
                         f"{refused_global(e)}; negft runs no code from a data file, so nothing in it ran") from None
    except (OSError, RuntimeError, EOFError, ValueError) as e:
        raise ValueError(f"{path}: unreadable torch file ({type(e).__name__}: {e})") from None
    if not isinstance(mapping, (torch.Tensor, list, tuple, dict)):
        raise ValueError(f"{path}: expected a tensor, list or dict of top-k COCO indices per row, found "
                         f"{type(mapping).__name__}")
    return mapping


def top1(mapping, row: int) -> int | None:
    """``mapping[row][0]``, the loader's top-1 distractor index, or None where there is no integer there."""
    try:
        index = mapping[row][0]
    except (IndexError, KeyError, TypeError):
        return None
    if isinstance(index, torch.Tensor):
        index = index.item() if index.numel() == 1 and not index.is_floating_point() else None
    return index if isinstance(index, int) and not isinstance(index, bool) else None


def coco_index(captions) -> list[dict]:
    """COCO's images as CocoCaptions indexes them: by id, smallest first (a repeated id: its last entry)."""
    with open(captions, encoding="utf-8") as f:
        data = json.load(f)
    images = data.get("images") if isinstance(data, dict) else None
    if not isinstance(images, list):
        raise ValueError(f"{captions} has no 'images' list (a COCO captions file has one)")
    by_id = {img["id"]: img for img in images if isinstance(img, dict) and isinstance(img.get("id"), int)}
    return [by_id[i] for i in sorted(by_id)]


def _bytes(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def record(row: dict, distractor_index: int, distractor: dict) -> dict:
    """The sample's json: the caption, its negated caption and the distractor as CoN-CLIP's loss reads them."""
    negated = row["negated"]
    return {
        CAPTION: row["caption"],
        RELCOMP: {"caption": row["caption"], "negatives": [{"text": negated, "kind": NEGATION}],
                  "negative_image": DISTRACTOR, "negative_image_caption": negated, "negative_image_negatives": []},
        "ccneg": {"row": row["index"], "image": row["image"],
                  "distractor": {"index": distractor_index, "image_id": distractor["id"],
                                 "file_name": distractor.get("file_name")}},
    }


def _distractor(mapping, row: int, coco: list[dict], folder: Path):
    """(index, COCO image entry, member extension, bytes) of the row's distractor, or the reason it has none."""
    index = top1(mapping, row)
    if index is None:
        return NO_DISTRACTOR
    if not 0 <= index < len(coco):
        return OUT_OF_RANGE
    name = coco[index].get("file_name")
    ext = IMAGE_EXTS.get(Path(name).suffix.lower()) if isinstance(name, str) else None
    data = _bytes(folder / name) if ext else None
    return MISSING_DISTRACTOR if data is None else (index, coco[index], ext, data)


def _inputs(pt, captions, images, mapping, root) -> tuple[Path, Path, Path, Path, Path]:
    """The input paths, defaults filled in; FileNotFoundError before anything is written."""
    pt, captions, images = Path(pt), Path(captions), Path(images)
    mapping = Path(mapping) if mapping else pt.parent / MAPPING
    root = Path(root) if root else pt.parent
    for path, what in ((pt, "CC-Neg file"), (mapping, "distractor mapping"), (captions, "COCO captions file")):
        if not path.is_file():
            raise FileNotFoundError(f"{what} {path} not found")
    for path, what in ((images, "COCO image folder (train2017)"), (root, "CC-Neg dataset folder")):
        if not path.is_dir():
            raise FileNotFoundError(f"{what} {path} not found")
    return pt, captions, images, mapping, root


def convert(pt, coco_captions, coco_images, out, mapping="", root="", maxcount="1000", progress="true") -> dict:
    """CC-Neg's fine-tuning rows (``pt``: ccneg_preprocessed.pt) with their distractors (``mapping``: default
    distractor_image_mapping.pt beside it; ``coco_captions``: captions_train2017.json; ``coco_images``: its
    train2017/ folder) → ``out/shard-*.tar`` + ``manifest.json``; ``root``: the folder the release's image paths
    are under (default: pt's folder). See the module docstring."""
    pt, captions, images, mapping, root = _inputs(pt, coco_captions, coco_images, mapping, root)
    rows, distractors, coco = fine_tuning_rows(pt), load_mapping(mapping), coco_index(captions)
    inputs = {"pt": str(pt), "mapping": str(mapping), "coco_captions": str(captions), "coco_images": str(images),
              "root": str(root)}
    with ShardWriter(out, "ccneg-train", LAYOUT_SOURCE, inputs, maxcount=int(maxcount),
                     progress=truthy(progress)) as writer:
        for index, image, annotation in rows:
            row = ccneg.parse_row(index, image, annotation)
            if isinstance(row, str):
                writer.skip(row, f"row {index}")
                continue
            ext = IMAGE_EXTS.get(Path(row["image"]).suffix.lower())
            if ext is None:
                writer.skip(BAD_TYPE, f"row {index} ({row['image']})")
                continue
            data = _bytes(Path(ccneg.image_path(root, row["image"])))
            if data is None:
                writer.skip(MISSING_IMAGE, f"row {index} ({row['image']})")
                continue
            found = _distractor(distractors, index, coco, images)
            if isinstance(found, str):
                writer.skip(found, f"row {index}")
                continue
            k, entry, neg_ext, neg = found
            writer.add(f"ccneg{index}", data, ext, record(row, k, entry), {f"neg.{neg_ext}": neg})
        writer.notes.update({"rows": {"fine_tuning": len(rows), "evaluation_left_out": ccneg.EVAL_ROWS},
                             "coco_images": len(coco)})
        manifest = writer.close()
    return {**manifest, "out": str(out)}
