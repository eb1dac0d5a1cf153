#!/bin/bash
# The GPU measurements of bench/RESULTS.md in one go on a GPU machine that lacks negft's own dependencies: installs
# the wheels carried in .whl/ (bench/RESULTS.md says which), then runs the benches; full logs go to $OUT.
#   bash bench/gpu_session.sh [syncs|step|contrastive|compile|throughput|world|loader] ...
#   (default: syncs step contrastive throughput loader)
set -u
source bench/gpu_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
python3 -c "import torch, deepspeed, open_clip; print('torch', torch.__version__, 'deepspeed', deepspeed.__version__, 'open_clip', open_clip.__version__)" 2>/dev/null
quiet() { grep -v -E "INFO|WARNING|warn|^\s*$|it/s\]|Warning|UserWarning|^  warnings" ; }
parts=${*:-syncs step contrastive throughput loader}
for part in $parts; do
  echo "== $part ($(date +%T))"
  case $part in
    syncs) timeout 240 python3 bench/gpu_syncs.py --jobs 6 2>&1 | tee "$OUT/syncs.log" | quiet ;;
    step) timeout 200 python3 bench/train_step_gpu.py --text-len 77 \
            --modes ${STEP_MODES:-plain,negft,negft-z1,bf16w-z1,bf16w-z1-nocheck,bf16w-z0,old,negft-fp32} 2>&1 | tee "$OUT/step.log" | quiet ;;
    contrastive) timeout 80 python3 bench/train_step_gpu.py --text-len 77 --negcap 320 --negmcq 0 --modes negft,plain \
            2>&1 | tee "$OUT/contrastive.log" | quiet ;;
    compile) timeout 400 python3 bench/train_step_gpu.py --text-len 77 --modes plain-compile,negft-compile \
            2>&1 | tee "$OUT/compile.log" | quiet ;;
    throughput) timeout 300 python3 bench/throughput.py --model ViT-B-32 --precision bf16 --batch 256 --steps 30 --repeat 3 \
            --workers 8 2>&1 | tee "$OUT/throughput.log" | quiet ;;
    world) timeout 220 python3 bench/throughput.py --model ViT-B-32 --precision bf16 --batch 256 --steps 30 --repeat 1 \
            --workers 8 --world --skip-peer 2>&1 | tee "$OUT/world.log" | quiet ;;
    loader) timeout 90 python3 bench/loader.py --arch ViT-B-32 --workers 8,15 --batches 30 --jpeg \
            2>&1 | tee "$OUT/loader.log" | quiet ;;
  esac
done
echo "== done ($(date +%T))"
