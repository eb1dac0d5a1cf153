"""What the text tower learns from NegFull on fixed image features, in minutes instead of a run.

    python bench/mcq_text_tower.py CKPT [--world DIR] [--steps 300] [--lr 1e-3] [--alpha 0.1] [--seed 0]
                                        [--patch] [--diag] [--grads]

Encodes the world's fine-tuning and test images once with CKPT's (frozen) image tower, then trains only the
text tower on α·L_clip(NegCap) + (1−α)·L_mcq(NegMCQ), as `tower=t` does, with the loop's AdamW settings
and schedule. Every `--eval-every` steps it prints test MCQ-Neg accuracy by answer template (and split by
whether the right answer uses a held-out phrasing), zero-shot accuracy per prompt template, text→image R@5
on the test Retrieval and Retrieval-Neg captions (the MCQ loss alone never contrasts images: watch them fall),
and the mean cosine between negation-only captions of different objects (1.0: the collapse of issue 2's note).
`--grads` prints each term's loss, gradient norm and the cosine between the two gradients every 25 steps.
`--patch` then evaluates the result interpolated toward CKPT (α the fine-tuned weight); `--diag` prints,
per text layer, how much the end-of-text token attends to the object in "This image does not feature a X".
Not the probe suite (no intervals): a quick way to compare settings before a real run.
"""
import argparse
import glob
import io
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import webdataset as wds
from PIL import Image

from negft import models
from negft.data import schema
from negft.data import world_text as T
from negft.probes import zeroshot as Z
from negft.probes.base import read_csv, resolve
from negft.probes.retrieval import caption_queries
from negft.probes.stats import recall_at_k
from negft.train.engine import lr_lambda, param_groups

SHAPES = ("star", "heart", "circle", "cross", "ring", "square")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt")
    ap.add_argument("--world", default="", help="world dir (default: the one the checkpoint records)")
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--alpha", type=float, default=0.0, help="weight of the NegCap contrastive term")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--eval-every", type=int, default=150)
    ap.add_argument("--patch", action="store_true")
    ap.add_argument("--diag", action="store_true")
    ap.add_argument("--grads", action="store_true", help="the two terms' gradient norms and cosine (needs --alpha)")
    ap.add_argument("--seed", type=int, default=0, help="seeds the batch draws")
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    t0 = time.time()
    bundle = models.build("", models.LOCAL_DIR + args.ckpt)
    model, tok = bundle.model.eval(), bundle.tokenizer
    world = Path(args.world or models.negft_info(Path(args.ckpt)).get("world_dir", ""))

    def images(paths_or_bytes):
        pix = [bundle.preprocess_val(Image.open(p).convert("RGB")) for p in paths_or_bytes]
        with torch.no_grad():
            return torch.cat([F.normalize(model.encode_image(torch.stack(pix[i:i + 256])), dim=-1)
                              for i in range(0, len(pix), 256)])

    metas, raw = [], []
    for s in wds.WebDataset(sorted(glob.glob(str(world / "finetune" / "*.tar")))[:args.shards], shardshuffle=False):
        metas.append(json.loads(s["json"]))
        raw.append(io.BytesIO(s["png"]))
    train_img = images(raw)
    mcqs = [m[schema.MCQ] for m in metas]
    answers = torch.tensor([q["answer"] for q in mcqs])
    rows = read_csv(world / "test" / "mcq.csv")
    test_img = images([resolve(world / "test", r["image_path"]) for r in rows])
    test_opts = [[r[f"caption_{j}"] for j in range(schema.N_OPTIONS)] for r in rows]
    test_ans = torch.tensor([int(r["correct_answer"]) for r in rows])
    templates = [r["correct_answer_template"] for r in rows]
    markers = [m.lower() for m in T.HELD_OUT_MARKERS["mcq"]]
    held = torch.tensor([any(m in o[a].lower() for m in markers) for o, a in zip(test_opts, test_ans.tolist())])
    zrows = read_csv(world / "test" / "zeroshot.csv")
    classes = Z.class_names(world / "test")
    zs_img = images([resolve(world / "test", r["filepath"]) for r in zrows])
    zs_label = torch.tensor([int(r["label"]) for r in zrows])
    prompts = Z.class_prompts(classes)
    retrieval = {}
    for name in ("retrieval", "retrieval_neg"):
        rrows = read_csv(world / "test" / f"{name}.csv")
        queries, targets = caption_queries(rrows)
        retrieval[name] = (images([resolve(world / "test", r["filepath"]) for r in rrows]), queries,
                           torch.tensor(targets))
    scale = float(model.logit_scale.exp().detach())
    print(f"{len(mcqs)} training MCQs, {len(rows)} test MCQs, {len(zrows)} zero-shot images; "
          f"logit scale {scale:.1f} [{time.time() - t0:.0f}s]", flush=True)

    def encode(texts):
        return F.normalize(models.encode_text_trimmed(model, tok(texts)), dim=-1)

    @torch.no_grad()
    def evaluate(tag):
        model.eval()
        opts = torch.cat([encode([o for r in test_opts[i:i + 256] for o in r]) for i in range(0, len(rows), 256)])
        ok = (torch.einsum("nd,ncd->nc", test_img, opts.view(len(rows), 4, -1)).argmax(1) == test_ans).float()
        by = {t: ok[[i for i, x in enumerate(templates) if x == t]].mean() for t in schema.MCQ_TEMPLATES}
        per = encode(prompts).view(len(classes), len(Z.TEMPLATES), -1)
        zs = ((zs_img @ F.normalize(per.mean(1), dim=-1).T).argmax(1) == zs_label).float().mean()
        zs_t = [((zs_img @ per[:, j].T).argmax(1) == zs_label).float().mean() for j in range(len(Z.TEMPLATES))]
        recall = []
        for name, (imgs, queries, target) in retrieval.items():
            sim = torch.cat([encode(queries[i:i + 512]) for i in range(0, len(queries), 512)]) @ imgs.T
            recall.append(f"{name} R@5 {recall_at_k(sim, target, (5,))[5].mean():.3f}")
        neg = encode([f"This image does not feature a {s}" for s in SHAPES])
        cos = (neg @ neg.T)[~torch.eye(len(SHAPES), dtype=torch.bool)].mean()
        print(f"{tag}: MCQ {ok.mean():.3f} (" + " ".join(f"{schema.TEMPLATE_NAMES[t]} {v:.3f}" for t, v in by.items())
              + f"; right answer held-out {ok[held].mean():.3f}, trained {ok[~held].mean():.3f}) zero-shot {zs:.3f} ("
              + " ".join(f"{t!r} {v:.3f}" for t, v in zip(Z.TEMPLATES, zs_t))
              + f") {', '.join(recall)}, negated-caption cosine {cos:.3f} [{time.time() - t0:.0f}s]", flush=True)

    evaluate("step 0")
    base = {k: v.detach().clone() for k, v in model.state_dict().items()}
    models.set_trainable(model, "t", train_logit_scale=False)
    opt = torch.optim.AdamW(param_groups(model, 0.1), lr=args.lr, betas=(0.9, 0.98), eps=1e-6)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(20, args.steps, 0.0))
    g = torch.Generator().manual_seed(args.seed)
    labels = torch.arange(args.batch)
    for step in range(1, args.steps + 1):
        model.train()
        model.visual.eval()
        idx = torch.randint(len(mcqs), (args.batch,), generator=g)
        texts = [o for i in idx.tolist() for o in mcqs[i]["options"]]
        if args.alpha:
            cap = torch.randint(len(mcqs), (args.batch,), generator=g)
            texts += [metas[i][schema.NEGCAP][int(torch.randint(3, (1,), generator=g))] for i in cap.tolist()]
        txt = encode(texts)
        opts = txt[:4 * args.batch].view(args.batch, 4, -1)
        loss = F.cross_entropy(scale * torch.einsum("nd,ncd->nc", train_img[idx], opts), answers[idx])
        if args.alpha:
            logits = scale * train_img[cap] @ txt[4 * args.batch:].T
            clip = (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2
            if args.grads and step % 25 in (0, 1):
                gradients(model, step, loss, clip)
            loss = args.alpha * clip + (1 - args.alpha) * loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
        opt.step()
        sched.step()
        if step % args.eval_every == 0 or step == args.steps:
            evaluate(f"step {step}")
    if args.patch:
        tuned = {k: v.detach().clone() for k, v in model.state_dict().items()}
        for a in (0.5, 0.6, 0.7, 0.8, 0.9):
            model.load_state_dict({k: (1 - a) * base[k] + a * v if v.is_floating_point() else v for k, v in tuned.items()})
            evaluate(f"patched α={a}")
        model.load_state_dict(tuned)
    if args.diag:
        for name, state in (("tuned", model.state_dict()), ("base", base)):
            model.load_state_dict(state)
            attention(model, tok, name)


def gradients(model, step, mcq, clip):
    trained = [p for p in model.parameters() if p.requires_grad]
    g_mcq = torch.autograd.grad(mcq, trained, retain_graph=True)
    g_clip = torch.autograd.grad(clip, trained, retain_graph=True)
    n_mcq = torch.sqrt(sum((g ** 2).sum() for g in g_mcq))
    n_clip = torch.sqrt(sum((g ** 2).sum() for g in g_clip))
    cos = sum((a * b).sum() for a, b in zip(g_mcq, g_clip)) / (n_mcq * n_clip)
    print(f"step {step}: L_mcq {mcq.item():.3f} L_clip {clip.item():.3f}, unweighted gradient norms "
          f"{n_mcq:.2f} / {n_clip:.2f}, cosine {cos:.3f}", flush=True)


@torch.no_grad()
def attention(model, tok, name):
    """Per layer: the end-of-text token's attention to the object, and how much its residual varies by object."""
    model.eval()
    tokens = tok([f"This image does not feature a {s}" for s in SHAPES])
    ends = tokens.argmax(-1)
    n = int(ends.max()) + 1
    x = model.token_embedding(tokens[:, :n]) + model.positional_embedding[:n]
    mask = torch.ones(n, n, dtype=torch.bool).triu(1)
    rows = torch.arange(len(SHAPES))
    for layer, block in enumerate(model.transformer.resblocks):
        y = block.ln_1(x)
        a, w = block.attn(y, y, y, need_weights=True, attn_mask=mask)
        x = x + a
        x = x + block.mlp(block.ln_2(x))
        end = x[rows, ends]
        print(f"{name} layer {layer}: end-of-text attention to the object {w[rows, ends, ends - 1].mean():.3f}, "
              f"residual spread across objects {(end - end.mean(0)).norm(dim=-1).mean():.2f} "
              f"(norm {end.norm(dim=-1).mean():.1f})")


if __name__ == "__main__":
    main()
