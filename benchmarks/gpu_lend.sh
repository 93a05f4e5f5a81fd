#!/usr/bin/env bash
# The prepared GPU lend (issue 28 item 6; shared/gpu.md): two device commands of at most 9 minutes
# each on an offline GPU machine, every result under $OUT as it finishes.
#
#   benchmarks/gpu_lend.sh prepare   # CPU machine, repository root: wheels of the packages the GPU
#                                    # machine lacks into .gpu_lend/whl, the SmolLM2 GGUF split in
#                                    # two pieces (.gpu_lend/gguf.1, gguf.2; ignored by git); prints
#                                    # the two device commands and what each carries
#   benchmarks/gpu_lend.sh 1         # device command 1: stash piece 1 and the packages under /tmp,
#                                    # the gpu-marked tests -> $OUT/gpu_tests.txt
#   benchmarks/gpu_lend.sh 2         # device command 2, issued right after (same warm machine):
#                                    # join the GGUF, llm_throughput.py (today's path, the ensemble
#                                    # at K=8 and 16, TRL) -> $OUT/throughput_k*.txt, then
#                                    # llm.claims --profile gpu --rungs llm --time-budget (the time
#                                    # left) -> $OUT/claims (resumed from results/claims_gpu)
#   benchmarks/gpu_lend.sh dry-run   # CPU: prepare's split and join on a stand-in, then 1 and 2 on
#                                    # the tiny model (an ensemble of 2 for the K=16 step), in about
#                                    # 1-2 minutes (tests/test_gpu_lend.py)
#
# Why the throughput benchmark is in command 2, not 1: the GGUF (98 MB) exceeds one command's
# 64 MiB, so the model exists on the machine only once command 2 has brought its second piece.
# Each command writes $OUT/provenance_<n>.json (command, device, torch, date, commit, exit codes).
# Knobs: GPU_LEND_SECONDS (each command's wall limit, default 530 s: 8 min 50 s), GPU_LEND_BENCH_S
# (the benchmark's share of command 2, default 300 s), PYTHON (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
STAGE=$ROOT/.gpu_lend
STASH=${GPU_LEND_STASH:-/tmp/gpu_lend}
PY=${PYTHON:-python3}
LIMIT=${GPU_LEND_SECONDS:-530}
BENCH_S=${GPU_LEND_BENCH_S:-300}
MARGIN=45
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf
START=$(date +%s)
DRY=0

left() { echo $((LIMIT - ($(date +%s) - START))); }

provenance() { # provenance <n> <name=exit code>...: what ran, where and when, into $OUT
  GPU_LEND_STAGE=$STAGE "$PY" - "$OUT/provenance_$1.json" "$DEVICE" "${@:2}" <<'EOF'
import json, os, platform, sys, time
path, device, codes = sys.argv[1], sys.argv[2], sys.argv[3:]
try:
    import torch
    torch_version = torch.__version__
    name = torch.cuda.get_device_name(0) if device == "cuda" and torch.cuda.is_available() else None
except ImportError:
    torch_version, name = None, None
if name is None:
    with open("/proc/cpuinfo") as f:
        name = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "cpu")
stage = os.environ["GPU_LEND_STAGE"]
commit_file = os.path.join(stage, "commit")
commit = open(commit_file).read().strip() if os.path.exists(commit_file) else None
record = {
    "command": os.environ.get("GPU_LEND_COMMAND"),
    "device": name,
    "device_kind": device,
    "torch": torch_version,
    "python": platform.python_version(),
    "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    "commit": commit,
    "exit_codes": dict(c.split("=", 1) for c in codes),
}
with open(path, "w") as f:
    json.dump(record, f, indent=2)
print(f"provenance: {path}")
EOF
}

packages() { # the wheels the GPU machine lacks, installed once under $STASH/site
  if [ "$DRY" = 1 ]; then export PYTHONPATH=$ROOT; return; fi
  if [ ! -d "$STASH/site" ]; then
    ls "$STAGE"/whl/*.whl >/dev/null 2>&1 || { echo "error: no wheels in $STAGE/whl: carry .gpu_lend/whl" >&2; exit 2; }
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$STASH/site" "$STAGE"/whl/*.whl
  fi
  export PYTHONPATH=$STASH/site:$ROOT
}

prepare() { # CPU machine: the pieces that travel (ignored by git: .gpu_lend/)
  local exclude gguf
  # best effort: a clone without .git/info (or no git at all) still prepares the pieces
  if exclude="$(git rev-parse --git-common-dir 2>/dev/null)/info/exclude"; then
    mkdir -p "$(dirname "$exclude")" 2>/dev/null &&
      { grep -qx '/.gpu_lend/' "$exclude" 2>/dev/null || echo '/.gpu_lend/' >>"$exclude"; } || true
  fi
  mkdir -p "$STAGE"
  git rev-parse HEAD >"$STAGE/commit" 2>/dev/null || echo unknown >"$STAGE/commit"
  if [ "$DRY" = 1 ]; then # a stand-in for the GGUF: the split and the join are what is checked
    gguf=$STAGE/standin.gguf
    head -c 3000001 /dev/urandom >"$gguf"
  else
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      -d "$STAGE/whl" gymnasium farama-notifications 'trl==1.16.*' datasets dill multiprocess gguf
    gguf=$(PYTHONPATH=$ROOT "$PY" -c "from llm.model import gguf_path; print(gguf_path('smollm2-135m'))")
  fi
  rm -f "$STAGE"/gguf.*
  split -n 2 "$gguf" "$STAGE/gguf.piece"
  mv "$STAGE/gguf.pieceaa" "$STAGE/gguf.1"
  mv "$STAGE/gguf.pieceab" "$STAGE/gguf.2"
  (cd "$(dirname "$gguf")" && sha256sum "$(basename "$gguf")") | awk '{print $1}' >"$STAGE/gguf.sha256"
  [ "$DRY" = 1 ] && rm -f "$gguf"
  du -sh "$STAGE"/gguf.1 "$STAGE"/gguf.2 "$STAGE"/whl 2>/dev/null || true
  cat <<EOF
Two device commands, issued back to back (the second on the same warm machine):
  run(command="bash benchmarks/gpu_lend.sh 1", carry=[".gpu_lend/whl", ".gpu_lend/gguf.1", ".gpu_lend/gguf.sha256", ".gpu_lend/commit"], timeout_s=560)
  run(command="bash benchmarks/gpu_lend.sh 2", carry=[".gpu_lend/whl", ".gpu_lend/gguf.2", ".gpu_lend/gguf.sha256", ".gpu_lend/commit"], timeout_s=560)
Then copy the results back (README, "GPU"): <files_at>/claims -> results/claims_gpu, the rest -> results/gpu_lend/<date>/.
EOF
}

command_1() { # stash piece 1 (and the packages), the gpu-marked tests
  mkdir -p "$STASH" "$OUT"
  [ -f "$STAGE/gguf.1" ] || { echo "error: $STAGE/gguf.1 missing: carry .gpu_lend/gguf.1 (run prepare first)" >&2; exit 2; }
  cp "$STAGE/gguf.1" "$STASH/gguf.1"
  packages
  local files rc=0
  files=$(grep -l "mark.gpu" tests/test_*.py | tr '\n' ' ')
  # shellcheck disable=SC2086
  timeout $(($(left) - MARGIN / 2)) "$PY" -m pytest -q -p no:cacheprovider -m gpu $XDIST $files \
    >"$OUT/gpu_tests.txt" 2>&1 || rc=$?
  tail -3 "$OUT/gpu_tests.txt"
  provenance 1 "gpu_tests=$rc"
}

command_2() { # join the GGUF, the throughput benchmark, then claims units in the time left
  mkdir -p "$OUT"
  [ -f "$STASH/gguf.1" ] || { echo "error: $STASH/gguf.1 missing: command 1 has not run on this machine (a fresh start?); issue command 2 right after command 1" >&2; exit 2; }
  cat "$STASH/gguf.1" "$STAGE/gguf.2" >"$STASH/$GGUF_NAME"
  echo "$(cat "$STAGE/gguf.sha256")  $STASH/$GGUF_NAME" | sha256sum -c --quiet - \
    || { echo "error: the joined GGUF's sha256 differs from prepare's" >&2; exit 2; }
  export CLIP_SANDBOX_SMOLLM2_GGUF=$STASH/$GGUF_NAME
  packages
  local k8=0 k16=0 claims=0 budget step_s
  # shellcheck disable=SC2086
  timeout $((BENCH_S * 2 / 3)) "$PY" benchmarks/llm_throughput.py $BENCH_ARGS --paths "$K8_PATHS" \
    --ensemble 8 --json "$OUT/throughput_k8.json" >"$OUT/throughput_k8.txt" 2>&1 || k8=$?
  # shellcheck disable=SC2086
  timeout $((BENCH_S / 3)) "$PY" benchmarks/llm_throughput.py $BENCH_ARGS --paths ensemble \
    --ensemble "$K16" --json "$OUT/throughput_k16.json" >"$OUT/throughput_k16.txt" 2>&1 || k16=$?
  tail -n 4 "$OUT/throughput_k8.txt" "$OUT/throughput_k16.txt" || true
  # the claims' first guess of an llm unit's time: today's seconds per step as measured just now
  # (runs side by side, as the study's workers run them), else llm.claims' own guess
  step_s=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["results"]["today"]["s_per_step"])' \
    "$OUT/throughput_k8.json" 2>/dev/null) || step_s=""
  if [ -n "$step_s" ]; then export CLIP_SANDBOX_LLM_STEP_SECONDS=$step_s; fi
  if [ -d results/claims_gpu/parts ] && [ ! -d "$OUT/claims" ]; then # go on from earlier lends
    cp -r results/claims_gpu "$OUT/claims"
  fi
  budget=$(($(left) - MARGIN)) # tables, the stop's grace (20 s) and the copy back
  if [ -n "$CLAIMS_S" ] && [ "$budget" -gt "$CLAIMS_S" ]; then budget=$CLAIMS_S; fi
  if [ "$budget" -gt 10 ]; then
    # shellcheck disable=SC2086
    timeout $((budget + CLAIMS_SLACK)) "$PY" -m llm.claims $CLAIMS_ARGS --time-budget "$budget" \
      --out "$OUT/claims" --no-progress >"$OUT/claims.txt" 2>&1 || claims=$?
    tail -2 "$OUT/claims.txt"
  fi
  rm -rf "$OUT/claims/llm_scratch" # GB-sized checkpoints never come back (64 MiB): cut runs restart
  # at most 8 files come back from $OUT: the study folder travels as one archive
  if [ -d "$OUT/claims" ]; then tar -C "$OUT" -czf "$OUT/claims.tgz" claims && rm -rf "$OUT/claims"; fi
  provenance 2 "throughput_k8=$k8" "throughput_k16=$k16" "claims=$claims"
}

export GPU_LEND_COMMAND="benchmarks/gpu_lend.sh $*"
DEVICE=cuda
XDIST="-n 8"
BENCH_ARGS="--device cuda --model smollm2-135m --warmup 2 --steps 3"
CLAIMS_ARGS="--profile gpu --device cuda --rungs llm"
K8_PATHS=${GPU_LEND_K8_PATHS:-today,trl,ensemble}  # the peers first: a failure or a cut in the ensemble spares them
K16=16       # the second ensemble's size (its output stays throughput_k16.txt)
CLAIMS_S=${GPU_LEND_CLAIMS_S:-}  # a cap on the claims' budget (none: the time left; 0: no claims)
CLAIMS_SLACK=30  # the claims' limit beyond its budget: imports, the stop's grace (20 s), tables
case "${1:-}" in
  prepare) prepare ;;
  1) OUT=${OUT:?set OUT (the device tool sets it)}; command_1 ;;
  2) OUT=${OUT:?set OUT (the device tool sets it)}; command_2 ;;
  dry-run)
    DRY=1 DEVICE=cpu XDIST="" STASH=$(mktemp -d) STAGE=$(mktemp -d) OUT=${OUT:-$(mktemp -d)}
    # the tiny model (--smoke: 1 warm-up + 1 step, one thread; today's path, then an ensemble of
    # 2 in the K=16 step: 16 members only add CPU time), the quick profile's llm rung for 15 s
    # (a unit starts, and ends or is stopped, whatever time the benchmark left). Limits, not
    # expected times: 90 s for command 1 (it only collects the gpu-marked tests, but on a loaded
    # 2-core machine that alone took over 25 s), 80 s + 40 s for the benchmark's two steps (each
    # 15-20 s of CPU), 15 + 60 s for the claims (a loaded machine slows its imports and the
    # stop of the unit it cut), so the dry run ends within 5 minutes
    BENCH_ARGS="--smoke --threads 1" K8_PATHS=today K16=2 MARGIN=10 BENCH_S=${GPU_LEND_BENCH_S:-120}
    CLAIMS_ARGS="--quick --rungs llm --device cpu --workers 1" CLAIMS_S=15 CLAIMS_SLACK=60
    prepare >/dev/null
    START=$(date +%s) LIMIT=90; command_1
    START=$(date +%s) LIMIT=${GPU_LEND_SECONDS:-$((BENCH_S + CLAIMS_S + MARGIN + 10))}; command_2
    rm -rf "$STASH" "$STAGE"
    echo "dry run: results in $OUT"
    ;;
  *) echo "usage: benchmarks/gpu_lend.sh prepare | 1 | 2 | dry-run" >&2; exit 2 ;;
esac
