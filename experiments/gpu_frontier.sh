#!/bin/bash
# The comparison (issue 59, experiments/comparison.py: every method on one declared grid and budget, one rule on val
# seed means, gains at equal zero-shot drift) on one GPU machine that lacks negft's own dependencies: installs the
# wheels carried in .whl/ (bench/RESULTS.md says which), runs the protocol for at most BUDGET seconds (a second call
# resumes where it stopped: finished runs are read, not rerun), and copies the rows, the tables and the logs to $OUT.
#   BUDGET=500 JOBS=14 STAGE=all bash experiments/gpu_frontier.sh
set -u
source bench/gpu_env.sh
nvidia-smi --query-gpu=name --format=csv,noheader; nproc
runs=runs/comparison-gpu
timeout "${BUDGET:-500}" python3 experiments/comparison.py --out $runs --jobs "${JOBS:-14}" --threads 1 \
  --stage "${STAGE:-all}" --arms 2>&1 | tee "$OUT/comparison.log" | grep -v "would run"
echo "comparison status ${PIPESTATUS[0]}"
cp $runs/comparison.jsonl $runs/summary.json $runs/table.md $runs/arms.md $runs/all_metrics.csv $runs/drift_gain.png "$OUT/" 2>/dev/null
# the runs without their checkpoints (about 1 MB a run), in parts of 15 MB (what comes back from a GPU machine is
# at most 16 MiB a file); here: cat runs.tgz.part-* | tar xzf -, then the same command with --stage table reads them
tar czf - --exclude=checkpoints --exclude='events.*' $runs | split -b 15M - "$OUT/runs.tgz.part-"
ls -la "$OUT"
