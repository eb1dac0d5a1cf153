#!/bin/bash
# The baselines' comparison over five world seeds (issue 45) on one GPU machine that lacks negft's own
# dependencies: installs the wheels carried in .whl/ (bench/RESULTS.md says which), runs experiments/frontier.py
# for at most BUDGET seconds (a second call resumes where it stopped), and copies the rows, the summary and the
# logs to $OUT.
#   BUDGET=500 JOBS=14 bash experiments/gpu_frontier.sh
set -u
source bench/gpu_env.sh
nvidia-smi --query-gpu=name --format=csv,noheader; nproc
runs=runs/frontier-gpu
timeout "${BUDGET:-500}" python3 experiments/frontier.py --out $runs --seeds 0,1,2,3,4 --alphas 0.1 \
  --jobs "${JOBS:-14}" --threads 1 --points emb-lr-0.1-hard-neg-0.5,negclip-lr1e-05,conclip-lr1e-05,negationclip-lr1e-05,tripletclip-lr1e-05,fscclip-lr1e-05,ceclip-lr1e-05 \
  2>&1 | tee "$OUT/frontier.log" | grep -v "would run"
echo "frontier status ${PIPESTATUS[0]}"
cp $runs/frontier.jsonl $runs/summary.json "$OUT/" 2>/dev/null
# the runs without their checkpoints (about 1 MB a run), in parts of 15 MB (what comes back from a GPU machine is
# at most 16 MiB a file); here: cat runs.tgz.part-* | tar xzf -, then experiments/frontier.py --dry-run with the
# same --out, --seeds and --points reads them and prints the table
tar czf - --exclude=checkpoints --exclude='events.*' $runs | split -b 15M - "$OUT/runs.tgz.part-"
ls -la "$OUT"
