# Sourced by the GPU scripts (bench/gpu_session.sh, experiments/gpu_frontier.sh) on a GPU machine that lacks negft's
# own dependencies: installs the wheels carried in .whl/ (bench/RESULTS.md says which) and sets the environment.
OUT=${OUT:-/tmp/negft-gpu-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  >"$OUT/pip.log" 2>&1 || { tail -5 "$OUT/pip.log"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NEGFT_CACHE=/tmp/negft-cache
