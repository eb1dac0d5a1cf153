"""World training images as an img2dataset download of CC12M + NegBench CSVs: a small example of the released files
the converter ``negft.convert.img2dataset`` reads, written on demand for tests and benches (not a format of the
world build: not in ``FORMATS``).

Layout (github.com/rom1504/img2dataset: ``img2dataset/writer.py`` WebDatasetSampleWriter / FilesSampleWriter,
``img2dataset/downloader.py`` compute_key and the meta dict, README "output format",
``dataset_examples/cc12m.md``): shards ``SSSSS.tar`` (``output_format=webdataset``) or sub-folders ``SSSSS/``
(``output_format=files``) of ``KEY.jpg``, ``KEY.txt`` and ``KEY.json``, with ``SSSSS_stats.json`` beside them;
the CSVs in NegBench's layouts (``negft.world.formats.negbench_csv``).
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

from negft.data import schema
from negft.convert import negbench as nb
from negft.world.formats.negbench_csv import mcq_row, negcap_row, world_rows, write_csv


def write_img2dataset_example(out_dir, n, seed=0, bad=True, output_format="webdataset", per_shard=16) -> dict:
    """``out_dir/cc12m/`` as img2dataset writes a download of ``n`` world images (JPEG), ``out_dir/negcap.csv``
    (NegCap columns + ``url``: the paper says the release carries URLs) and ``out_dir/mcq.csv`` (NegMCQ
    columns), paths ``/data/cc12m/SSSSS/KEY.jpg`` as an img2dataset ``files`` download would give.

    With ``bad``: 3 rows whose download failed (in the CSVs, no image), 2 downloaded images no CSV row names,
    a malformed list cell in NegCap and an empty option in NegMCQ. Returns the paths and, under ``expected``,
    the counts of converting ``negcap``, ``mcq`` or ``negcap+mcq`` (``mcq=``) against the folder."""
    import webdataset as wds
    out_dir, root = Path(out_dir), Path(out_dir) / "cc12m"
    root.mkdir(parents=True, exist_ok=True)
    oom = math.ceil(math.log10(per_shard))
    failed = {2, 7, 11} if bad else set()
    unannotated = {5, 9} if bad else set()
    negcap_rows, mcq_rows = [], []
    shards: dict[int, list] = {}
    for i, (data, rec, _) in enumerate(world_rows(n + len(failed) + len(unannotated), seed)):
        shard, key = i // per_shard, f"{(i // per_shard) * 10 ** oom + i % per_shard:0{oom + 5}d}"
        url = f"https://cc12m.invalid/img/{seed}/{i}.jpg"
        path = f"/data/cc12m/{shard:05d}/{key}.jpg"
        if i not in unannotated:
            negcap_rows.append({**negcap_row(rec, path), "url": url})
            mcq_rows.append(mcq_row(rec, path))
        meta = {"url": url, "caption": rec[schema.CAPTION], "key": key, "status": "success", "error_message": None,
                "width": 64, "height": 64, "original_width": 64, "original_height": 64, "exif": "{}", "sha256": None}
        if i in failed:
            meta.update(status="failed_to_download", error_message="HTTP Error 404: Not Found", width=None,
                        height=None, original_width=None, original_height=None, exif=None)
        shards.setdefault(shard, []).append((key, data, rec[schema.CAPTION], meta))
    for shard, items in shards.items():
        name = f"{shard:05d}"
        ok = [x for x in items if x[3]["status"] == "success"]
        if output_format == "webdataset":
            with wds.TarWriter(str(root / f"{name}.tar")) as tw:
                for key, data, caption, meta in ok:
                    tw.write({"__key__": key, "jpg": data, "txt": caption, "json": json.dumps(meta, indent=4)})
        else:
            (root / name).mkdir(exist_ok=True)
            for key, data, caption, meta in ok:
                (root / name / f"{key}.jpg").write_bytes(data)
                (root / name / f"{key}.txt").write_text(caption)
                (root / name / f"{key}.json").write_text(json.dumps(meta, indent=4))
        (root / f"{name}_stats.json").write_text(json.dumps(
            {"count": len(items), "successes": len(ok), "failed_to_download": len(items) - len(ok),
             "failed_to_resize": 0, "duration": 0.0, "start_time": time.time(), "end_time": time.time(),
             "status_dict": {"success": len(ok)}}, indent=4))
    if bad:            # a malformed list cell in NegCap (row 0), an empty option in NegMCQ (row 1)
        negcap_rows[0][nb.NEGCAPS] = "['no cat', "
        mcq_rows[1][nb.OPTIONS[3]] = ""

    def expected(good, skipped, no_annotation):
        return {"good": good, "skipped": {k: v for k, v in skipped.items() if v},
                "annotations_without_image": skipped.get(nb.MISSING_IMAGE, 0),
                "images_without_annotation": no_annotation}
    f, u, b = len(failed), len(unannotated), int(bad)
    # an image whose only annotation row is bad counts as an image without annotation
    result = {"negcap": expected(n - b, {nb.MISSING_IMAGE: f, nb.MALFORMED_LIST: b}, u + b),
              "mcq": expected(n - b, {nb.MISSING_IMAGE: f, nb.EMPTY_CAPTION: b}, u + b),
              "negcap+mcq": expected(n, {nb.MISSING_IMAGE: 2 * f, nb.MALFORMED_LIST: b, nb.EMPTY_CAPTION: b}, u)}
    write_csv(out_dir / "negcap.csv", [*schema.NEGCAP_CSV_COLUMNS, "url"], negcap_rows)
    write_csv(out_dir / "mcq.csv", schema.MCQ_CSV_COLUMNS, mcq_rows)
    return {"folder": str(root), "negcap": str(out_dir / "negcap.csv"), "mcq": str(out_dir / "mcq.csv"),
            "expected": result}
