"""What the text tower learns from NegFull on fixed image features, in minutes instead of a run.

    python experiments/mcq_text_tower.py CKPT [--world DIR] [--steps 300] [--lr 1e-3] [--alpha 0.1] [--seed 0]
                                        [--patch] [--diag] [--grads]

Encodes the world's fine-tuning images once with CKPT's (frozen) image tower, then trains only the text tower
with negft's NegFull loss, α·L_clip(NegCap) + (1−α)·L_mcq(NegMCQ), as `tower=t` does, with the loop's AdamW
settings and schedule. Every `--eval-every` steps it runs the probes on the test split, scored as the ledger
scores them (ties shared), and prints MCQ-Neg accuracy by answer template (and split by whether the right answer
uses a held-out phrasing), zero-shot accuracy (and per prompt template), text→image R@5 on Retrieval and
Retrieval-Neg (the MCQ loss alone never contrasts images: watch them fall), and Geometry's negated-object
separation (near 0: every negation-only caption collapsed onto one point). The image features are encoded once.
`--grads` prints each term's loss, gradient norm and the cosine between the two gradients every 25 steps.
`--patch` then evaluates the result patched toward CKPT (negft.patching, tower mode t, α the fine-tuned weight);
`--diag` prints, per text layer, how much the end-of-text token attends to the object in "This image does not
feature a X". No intervals: a quick way to compare settings before a real run.
"""
import argparse
import io
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from negft import models  # noqa: E402
from negft import phrasings
from negft.data import schema  # noqa: E402
from negft.data.shards import read_samples  # noqa: E402
from negft.evaluation import run_suite  # noqa: E402
from negft.losses import ContrastiveLoss, MCQLoss, NegFullLoss  # noqa: E402
from negft.patching import interpolate  # noqa: E402
from negft.probes import mcq_neg, zeroshot  # noqa: E402
from negft.probes.base import Dataset, PixelCache  # noqa: E402
from negft.probes.stats import recall_at_k  # noqa: E402
from negft.train.engine import lr_lambda, param_groups  # noqa: E402

SHAPES = ("star", "heart", "circle", "cross", "ring", "square")
SUITE = "mcq_neg,zeroshot,retrieval,retrieval_neg,geometry"


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
    ap.add_argument("--guard-caption", type=float, default=0.0, help="loss.guard.caption: distil the step's captions")
    ap.add_argument("--guard-options", type=float, default=0.0, help="loss.guard.options: distil affirmative options")
    ap.add_argument("--guard-kl", type=float, default=0.0, help="loss.guard.kl: the batch's image→caption softmax")
    ap.add_argument("--guard-l2sp", type=float, default=0.0, help="loss.guard.l2sp: anchor on the trained weights")
    ap.add_argument("--freeze-lower", type=int, default=0, help="freeze the token embedding and the first N blocks")
    ap.add_argument("--t2i", type=float, default=0.0, help="loss.t2i: text→image MCQ term on the right answers")
    ap.add_argument("--emb-lr", type=float, default=1.0, help="learning-rate multiplier of the token embedding")
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    t0 = time.time()
    bundle = models.build("", models.LOCAL_DIR + args.ckpt)
    model, tok = bundle.model.eval(), bundle.tokenizer
    world = Path(args.world or models.negft_info(Path(args.ckpt)).get("world_dir", ""))

    samples = list(read_samples(sorted((world / "finetune").glob("*.tar"))[:args.shards]).values())
    metas = [json.loads(s["json"]) for s in samples]
    pix = [bundle.preprocess_val(Image.open(io.BytesIO(s["png"])).convert("RGB")) for s in samples]
    with torch.no_grad():
        train_img = torch.cat([F.normalize(model.encode_image(torch.stack(pix[i:i + 256])), dim=-1)
                               for i in range(0, len(pix), 256)])
    mcqs = [m[schema.MCQ] for m in metas]
    answers = torch.tensor([q["answer"] for q in mcqs])
    test = Dataset("world", world / "test")
    # the test questions whose right answer uses a held-out phrasing (the MCQ probe's rows, in its order)
    markers = [m.lower() for m in phrasings.HELD_OUT_MARKERS["mcq"]]
    held = torch.tensor([any(m in r["options"][r["answer"]].lower() for m in markers)
                         for r in mcq_neg.load(test)["rows"]])
    zs = zeroshot.load(test)
    scale = float(model.logit_scale.exp().detach())
    print(f"{len(mcqs)} training MCQs, {len(held)} test MCQs, {len(zs['paths'])} zero-shot images; "
          f"logit scale {scale:.1f} [{time.time() - t0:.0f}s]", flush=True)
    # the image tower stays frozen: its test features are encoded once, for every evaluation
    image_cache, token_cache, pixel_cache = {}, {}, PixelCache()

    def encode(texts):
        return F.normalize(models.encode_text_trimmed(model, tok(texts)), dim=-1)

    def report(tag):
        """The probes on the test split (ties shared, as the ledger scores them), and the diagnostics."""
        texts = {}
        result = run_suite(model, bundle.preprocess_val, tok, [test], SUITE, n_boot=1, image_cache=image_cache,
                          text_cache=texts, token_cache=token_cache, pixel_cache=pixel_cache)
        m = {k.replace("/world/", "/"): v for k, v in result.metrics.items()}
        credit = torch.tensor([r["credit"] for r in result.records["mcq_neg/world"]])
        prompts = torch.stack([texts[p] for p in zs["prompts"]]).view(len(zs["classes"]), -1, train_img.shape[1])
        images, labels = torch.stack([image_cache[p] for p in zs["paths"]]), torch.tensor(zs["labels"])
        per_template = [recall_at_k(images @ prompts[:, j].T, labels, (1,))[1].mean() for j in range(prompts.shape[1])]
        print(f"{tag}: MCQ {m['mcq_neg/acc']:.3f} ("
              + " ".join(f"{n} {m['mcq_neg/acc_' + n]:.3f}" for n in schema.TEMPLATE_NAMES.values())
              + f"; right answer held-out {credit[held].mean():.3f}, trained {credit[~held].mean():.3f}) "
              f"zero-shot {m['zeroshot/top1']:.3f} (per template " + " ".join(f"{v:.3f}" for v in per_template)
              + f") R@5 retrieval {m['retrieval/r5']:.3f}, retrieval_neg {m['retrieval_neg/r5']:.3f}, "
              f"negated-object separation {m['geometry/negated_object_separation']:.3f} "
              f"[{time.time() - t0:.0f}s]", flush=True)

    report("step 0")
    base = {k: v.detach().clone() for k, v in model.state_dict().items()}
    models.set_trainable(model, "t", train_logit_scale=False)
    import copy
    from negft.losses import DriftGuard
    guard = DriftGuard(args.guard_caption, args.guard_options, args.guard_kl, args.guard_l2sp)
    reference = copy.deepcopy(model).eval() if guard.active else None
    anchors = [(p, p.detach().clone()) for p in model.parameters() if p.requires_grad] if args.guard_l2sp else None
    captions = [m[schema.CAPTION] for m in metas]
    if args.freeze_lower:
        model.token_embedding.weight.requires_grad_(False)
        for block in model.transformer.resblocks[:args.freeze_lower]:
            block.requires_grad_(False)
    groups = param_groups(model, 0.1)
    if args.emb_lr != 1.0:
        emb = model.token_embedding.weight
        for gr in groups:
            gr["params"] = [p for p in gr["params"] if p is not emb]
        groups.append({"params": [emb], "weight_decay": 0.1, "lr": args.lr * args.emb_lr})
    loss_fn = NegFullLoss(args.alpha)
    opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.98), eps=1e-6)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(20, args.steps, 0.0))
    g = torch.Generator().manual_seed(args.seed)
    for step in range(1, args.steps + 1):
        models.train_mode(model, "t")
        idx = torch.randint(len(mcqs), (args.batch,), generator=g)
        texts = [o for i in idx.tolist() for o in mcqs[i]["options"]]
        if args.alpha:
            cap = torch.randint(len(mcqs), (args.batch,), generator=g)
            texts += [metas[i][schema.NEGCAP][int(torch.randint(3, (1,), generator=g))] for i in cap.tolist()]
        txt = encode(texts)
        opts = txt[:4 * args.batch].view(args.batch, 4, -1)
        mcq = (train_img[idx], opts, answers[idx])
        contrastive = (train_img[cap], txt[4 * args.batch:]) if args.alpha else None
        if args.grads and contrastive is not None and step % 25 in (0, 1):
            gradients(model, step, MCQLoss()(*mcq, scale), ContrastiveLoss()(*contrastive, scale))
        loss, _ = loss_fn(scale, contrastive=contrastive, mcq=mcq)
        if args.t2i:
            from negft.losses import TextToImageMCQLoss
            truth = answer_truth([metas[i] for i in idx.tolist()])
            loss = loss + args.t2i * TextToImageMCQLoss()(train_img[idx], opts[torch.arange(args.batch), answers[idx]],
                                                          truth, scale)
        if guard.active:
            imgs = idx if not args.alpha else torch.cat([idx, cap])
            caps = [captions[i] for i in imgs.tolist()]
            f = encode(caps) if guard.needs_captions else None
            aff = [o for i in idx.tolist() for o, t in zip(mcqs[i]["options"], mcqs[i]["option_templates"])
                   if t == "positive"]
            keep = torch.tensor([t == "positive" for i in idx.tolist() for t in mcqs[i]["option_templates"]])
            with torch.no_grad():
                f_base = F.normalize(models.encode_text_trimmed(reference, tok(caps)), dim=-1)
                o_base = F.normalize(models.encode_text_trimmed(reference, tok(aff)), dim=-1) if aff else None
            g_loss, _ = guard(caption=(f, f_base) if f is not None else None,
                              options=(txt[:4 * args.batch][keep], o_base) if aff else None,
                              kl=(train_img[imgs], f, scale, train_img[imgs], f_base, scale) if f is not None else None,
                              l2sp=anchors)
            loss = loss + g_loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
        opt.step()
        sched.step()
        if step % args.eval_every == 0 or step == args.steps:
            report(f"step {step}")
    if args.patch:
        tuned = {k: v.detach().clone() for k, v in model.state_dict().items()}
        for a in (0.5, 0.6, 0.7, 0.8, 0.9):
            model.load_state_dict(interpolate(base, tuned, a, "t"))
            report(f"patched α={a}")
        model.load_state_dict(tuned)
    if args.diag:
        for name, state in (("tuned", model.state_dict()), ("base", base)):
            model.load_state_dict(state)
            attention(model, tok, name)


def answer_truth(metas):
    from negft.losses import answer_truth as truth
    return truth(metas)


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
