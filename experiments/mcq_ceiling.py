"""How far could a text tower go on the world's NegMCQ with this checkpoint's image features?

    python experiments/mcq_ceiling.py CKPT [--world DIR] [--shards 3] [--steps 600]

Fits one free, normalised text embedding per distinct option *meaning* (its template and the shapes it names,
in order: "no heart", "heart but not star", ...) to the MCQ loss on 80% of the fine-tuning MCQs, with the image
features fixed and the checkpoint's logit scale, and prints held-out accuracy by answer template beside the
checkpoint's own text tower on the same questions. The gap is what the text tower leaves on the table; a low
ceiling would instead say the image features cannot tell the options apart.
"""
import argparse
import collections
import glob
import io
import json
import re
from pathlib import Path

import torch
import torch.nn.functional as F
import webdataset as wds
from PIL import Image

from negft import models
from negft.data import schema


def meaning(option: str, template: str, shapes: list[str]) -> tuple:
    found = sorted((m.start(), s) for s in shapes for m in re.finditer(rf"\b{s}\b", option.lower()))
    return (template, *[s for _, s in found])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt")
    ap.add_argument("--world", default="", help="world dir (default: the one the checkpoint records)")
    ap.add_argument("--shards", type=int, default=3)
    ap.add_argument("--steps", type=int, default=600)
    args = ap.parse_args()
    torch.manual_seed(0)
    bundle = models.build("", models.LOCAL_DIR + args.ckpt)
    model = bundle.model.eval()
    world = Path(args.world or models.negft_info(Path(args.ckpt)).get("world_dir", ""))
    shapes = json.loads((world / "world.json").read_text())["shapes"]
    urls = sorted(glob.glob(str(world / "finetune" / "*.tar")))[:args.shards]
    qs, pixels = [], []
    for sample in wds.WebDataset(urls, shardshuffle=False):
        qs.append(json.loads(sample["json"])[schema.MCQ])
        pixels.append(bundle.preprocess_val(Image.open(io.BytesIO(sample["png"])).convert("RGB")))
    with torch.no_grad():
        images = torch.cat([F.normalize(model.encode_image(torch.stack(pixels[i:i + 256])), dim=-1)
                            for i in range(0, len(pixels), 256)])
        scale = float(model.logit_scale.exp())
    keys = [[meaning(o, t, shapes) for o, t in zip(q["options"], q["option_templates"])] for q in qs]
    index = {k: i for i, k in enumerate(sorted({k for ks in keys for k in ks}))}
    options = torch.tensor([[index[k] for k in ks] for ks in keys])
    answers = torch.tensor([q["answer"] for q in qs])
    train = torch.arange(len(qs)) < int(0.8 * len(qs))

    free = torch.nn.Parameter(0.1 * torch.randn(len(index), images.shape[1]))
    opt = torch.optim.Adam([free], lr=0.05)
    for _ in range(args.steps):
        logits = scale * torch.einsum("nd,nkd->nk", images, F.normalize(free, dim=-1)[options])
        loss = F.cross_entropy(logits[train], answers[train])
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        free_pick = torch.einsum("nd,nkd->nk", images, F.normalize(free, dim=-1)[options]).argmax(1)
        texts = [o for q in qs for o in q["options"]]
        tower = torch.cat([F.normalize(models.encode_text_trimmed(model, bundle.tokenizer(texts[i:i + 1024])), dim=-1)
                           for i in range(0, len(texts), 1024)]).view(len(qs), schema.N_OPTIONS, -1)
        tower_pick = torch.einsum("nd,nkd->nk", images, tower).argmax(1)
    print(f"{len(qs)} MCQs from {len(urls)} shards, {len(index)} option meanings, {int(train.sum())} to fit; "
          f"held-out accuracy (free embeddings | the checkpoint's text tower):")
    rows = collections.defaultdict(lambda: [0, 0, 0])
    for i in torch.nonzero(~train).flatten().tolist():
        for name in (qs[i]["answer_template"], "all"):
            rows[name][0] += 1
            rows[name][1] += int(free_pick[i] == answers[i])
            rows[name][2] += int(tower_pick[i] == answers[i])
    for name in (*schema.MCQ_TEMPLATES, "all"):
        n, f, t = rows[name]
        if not n:
            continue
        print(f"  {schema.TEMPLATE_NAMES.get(name, name):12s} n={n:4d}  free {f / n:.3f} | tower {t / n:.3f}")


if __name__ == "__main__":
    main()
