"""Time a patching sweep against one full evaluation and against evaluating every α from scratch.

    python bench/bench_patch.py FINETUNED_CKPT BASE [--tower t] [--alphas 0:1:0.1] [--split val] [--naive]

The sweep (negft.patching.sweep) encodes the tower a mode does not move once for all α; the naive
sweep, as in the PAINT / WiSE-FT code, evaluates each patched model from nothing. Prints seconds.
"""
import argparse
import time


from negft.evaluation import datasets_for, run_suite, world_root
from negft.patching import interpolate, load_pair, parse_alphas, sweep


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("finetuned")
    ap.add_argument("base", help="base checkpoint dir / file / tag, or 'recorded'")
    ap.add_argument("--tower", default="t")
    ap.add_argument("--alphas", default="0:1:0.1")
    ap.add_argument("--split", default="val")
    ap.add_argument("--bootstrap", type=int, default=1000)
    ap.add_argument("--naive", action="store_true", help="also time every α evaluated from scratch")
    args = ap.parse_args()
    bundle, base_state, ft_state, info = load_pair(args.base, args.finetuned)
    world = world_root(info) if info.get("data") == "world" else None
    datasets = datasets_for(world / args.split if world else None)
    alphas = parse_alphas(args.alphas)
    kw = dict(batch_size=256, n_boot=args.bootstrap, device="cpu")

    bundle.model.load_state_dict(ft_state)
    t0 = time.time()
    run_suite(bundle.model, bundle.preprocess_val, bundle.tokenizer, datasets, "default", **kw)
    one = time.time() - t0
    print(f"one full evaluation ({args.split}): {one:.2f} s")

    t0 = time.time()
    sweep(bundle, base_state, ft_state, alphas, [args.tower], datasets, "default", progress=False, **kw)
    cached = time.time() - t0
    print(f"sweep tower={args.tower} over {len(alphas)} alphas, shared features: {cached:.2f} s "
          f"= {cached / one:.2f} x one evaluation")

    if args.naive:
        t0 = time.time()
        for a in alphas:
            bundle.model.load_state_dict(interpolate(base_state, ft_state, a, args.tower))
            run_suite(bundle.model, bundle.preprocess_val, bundle.tokenizer, datasets, "default", **kw)
        naive = time.time() - t0
        print(f"naive sweep (each alpha from scratch): {naive:.2f} s = {naive / one:.2f} x one evaluation")


if __name__ == "__main__":
    main()
