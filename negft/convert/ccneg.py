"""``negft data convert ccneg IN OUT``: CC-Neg's ``ccneg_preprocessed.pt`` as JSON, for a file that
``torch.load(weights_only=True)`` refuses.

The ccneg probe (negft/probes/ccneg.py, which documents the layout) opens the release's torch file only with
``weights_only=True``, which runs no code. If the file's pickle holds objects of other classes, the probe skips it
and names this command. Running it is the user's explicit decision to trust the file: it loads ``IN`` with
``torch.load(weights_only=False)``, which runs whatever code the pickle carries, so run it only on a file whose
origin you trust. It writes ``OUT`` (next to ``IN``, named ``ccneg_preprocessed.json``, which the probe reads in
the .pt's place) with the same dict, only what the loader reads:

    {"image_paths": [path, ...],
     "annotations": [{"json": {"caption": str}, "sop_data": {"negative-prompt": str}}, ...]}

every row in file order (the probe takes the evaluation split, the last rows, from it as from the .pt). A value
that is not a string is written as null, which the probe counts as a skipped row; nothing else is changed (the
negated caption's commas are removed by the reader, as CoN-CLIP's loader does). ``OUT`` is never overwritten.
"""
from __future__ import annotations

import json
from pathlib import Path

from negft.io import atomic_write


def _string(value) -> str | None:
    return value if isinstance(value, str) else None


def _annotation(row) -> dict | None:
    if not isinstance(row, dict):
        return None
    caption = row.get("json") if isinstance(row.get("json"), dict) else {}
    sop = row.get("sop_data") if isinstance(row.get("sop_data"), dict) else {}
    return {"json": {"caption": _string(caption.get("caption"))},
            "sop_data": {"negative-prompt": _string(sop.get("negative-prompt"))}}


def convert(pt, out) -> dict:
    """``pt`` (CC-Neg's torch file) -> ``out`` (JSON the ccneg probe reads); see the module docstring."""
    import torch
    if not Path(pt).is_file():
        raise FileNotFoundError(f"CC-Neg file {pt} not found")
    if Path(out).exists():
        raise FileExistsError(f"'{out}' exists and is never overwritten")
    data = torch.load(pt, map_location="cpu", weights_only=False)      # the user's explicit request: see above
    paths, annotations = (data.get("image_paths"), data.get("annotations")) if isinstance(data, dict) else (None, None)
    if not isinstance(paths, list) or not isinstance(annotations, list):
        raise ValueError(f"{pt}: expected a dict with the lists 'image_paths' and 'annotations', found "
                         f"{type(data).__name__}")
    rows = [_annotation(a) for a in annotations]
    atomic_write(out, json.dumps({"image_paths": [_string(p) for p in paths], "annotations": rows}))
    return {"out": str(out), "counts": {"rows": len(rows), "image_paths": len(paths),
                                        "null_annotations": sum(r is None for r in rows)}}
