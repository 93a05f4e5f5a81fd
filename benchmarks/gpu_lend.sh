#!/usr/bin/env bash
# The prepared GPU lend (issue 28 item 6; shared/gpu.md): device commands on an offline GPU
# machine, issued back to back on one warm machine, every result under $OUT as it finishes.
#
#   benchmarks/gpu_lend.sh prepare   # CPU machine, repository root: wheels of the packages the GPU
#                                    # machine lacks into .gpu_lend/whl, the SmolLM2 GGUF split in
#                                    # as few pieces as fit one command each beside the working tree
#                                    # (.gpu_lend/gguf.1..N; ignored by git; 3 with an 18 MiB tree);
#                                    # checks each command's size and prints the commands
#   benchmarks/gpu_lend.sh 1         # device command 1: stash piece 1 and the packages under /tmp,
#                                    # the gpu-marked tests -> $OUT/gpu_tests.txt
#   benchmarks/gpu_lend.sh stash     # the middle pieces' commands: stash the piece carried
#   benchmarks/gpu_lend.sh 2         # the last command (same warm machine): join the GGUF,
#                                    # llm_throughput.py (the ensemble at K=8 with today's path, the
#                                    # fast run and TRL; then K=16) -> $OUT/throughput_k*.txt/json,
#                                    # then llm.claims --profile gpu --rungs llm --time-budget (the
#                                    # time left) -> $OUT/claims.tgz (resumed from results/claims_gpu)
#   benchmarks/gpu_lend.sh dry-run   # CPU: prepare's split (3 pieces) and join on a stand-in, then
#                                    # 1, stash and 2 on the tiny model (an ensemble of 2 for the
#                                    # K=16 step), in about 1-2 minutes (tests/test_gpu_lend.py)
#
# Why the throughput benchmark is in the last command: the GGUF (98 MB) exceeds one command's
# 64 MiB, so the model exists on the machine only once the last piece has arrived. The first lend
# (results/gpu_lend/2026-11-26) had 900 s of device time in all: a start took ~45 s, command 1
# ~60 s, a stash ~1 s. Each command writes $OUT/provenance_<n>.json (command, device, torch, date,
# commit, exit codes); at most 8 files come back, so the study folder returns as claims.tgz.
# Knobs: GPU_LEND_SECONDS (a command's wall limit, default 530 s), GPU_LEND_BENCH_S (the
# benchmark's share of command 2, default 360 s), GPU_LEND_CLAIMS_S (a cap on the claims' budget;
# 0: no claims), GPU_LEND_K8_PATHS (the K=8 step's paths, in order), GPU_LEND_PIECES (the split),
# PYTHON (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
STAGE=$ROOT/.gpu_lend
STASH=${GPU_LEND_STASH:-/tmp/gpu_lend}
PY=${PYTHON:-python3}
LIMIT=${GPU_LEND_SECONDS:-530}
BENCH_S=${GPU_LEND_BENCH_S:-360}
MARGIN=45
TRAVEL_MIB=64  # what one device command carries, the working tree included
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
  local pieces k size tree
  tree=$(tree_bytes)
  pieces=$(pieces_for "$gguf" "$tree")
  split -n "$pieces" -d -a 2 "$gguf" "$STAGE/gguf.piece"
  for k in $(seq 1 "$pieces"); do mv "$STAGE/gguf.piece$(printf %02d $((k - 1)))" "$STAGE/gguf.$k"; done
  echo "$pieces" >"$STAGE/gguf.count"
  (cd "$(dirname "$gguf")" && sha256sum "$(basename "$gguf")") | awk '{print $1}' >"$STAGE/gguf.sha256"
  [ "$DRY" = 1 ] && rm -f "$gguf"
  for k in $(seq 1 "$pieces"); do # what each command carries, against the tool's 64 MiB
    size=$((tree + $(bytes_of "$STAGE/gguf.$k" "$STAGE/whl")))
    echo "command carrying piece $k: $((size / 1048576)) MiB of 64 (the working tree included)"
    [ "$size" -le $((TRAVEL_MIB * 1048576)) ] || { echo "error: piece $k travels $size bytes, over the ${TRAVEL_MIB} MiB a command carries" >&2; exit 2; }
  done
  local carry='".gpu_lend/whl", ".gpu_lend/gguf.sha256", ".gpu_lend/gguf.count", ".gpu_lend/commit"'
  echo "Device commands, issued back to back on one warm machine (status's budget_left_s after the"
  echo "stashes sets the last one's limit, B: GPU_LEND_SECONDS = min(B - 60, 560), timeout_s = it + 15):"
  echo "  run(command=\"GPU_LEND_SECONDS=150 bash benchmarks/gpu_lend.sh 1\", carry=[\".gpu_lend/gguf.1\", $carry], timeout_s=170)"
  for k in $(seq 2 $((pieces - 1))); do
    echo "  run(command=\"bash benchmarks/gpu_lend.sh stash\", carry=[\".gpu_lend/gguf.$k\"], timeout_s=60)"
  done
  echo "  run(command=\"GPU_LEND_SECONDS=<S> bash benchmarks/gpu_lend.sh 2\", carry=[\".gpu_lend/gguf.$pieces\", $carry], timeout_s=<S + 15>)"
  echo "Then copy the results back (README, \"GPU\"): <files_at>/claims.tgz unpacked -> results/claims_gpu, the rest -> results/gpu_lend/<date>/."
}

tree_bytes() { # what the device tool sends besides the carried paths: tracked and untracked-not-ignored files
  if git rev-parse --git-dir >/dev/null 2>&1; then
    { git ls-files -z; git ls-files -z -o --exclude-standard; } | (xargs -0 -r du -cb 2>/dev/null || true) \
      | awk '$2 == "total" {n += $1} END {print n + 0}'
  else
    du -sb --exclude=.gpu_lend --exclude=.venv --exclude=.git . | cut -f1
  fi
}

bytes_of() { # the bytes of the paths given that exist (a folder: all it holds)
  local n=0 f
  for f in "$@"; do [ -e "$f" ] && n=$((n + $(du -sb "$f" | cut -f1))); done
  echo "$n"
}

pieces_for() { # the fewest pieces of $1 that fit one command each beside the tree ($2 bytes)
  local room # and the wheels
  [ -n "${GPU_LEND_PIECES:-}" ] && { echo "$GPU_LEND_PIECES"; return; }
  room=$((TRAVEL_MIB * 1048576 - $2 - $(bytes_of "$STAGE/whl") - 1048576))
  [ "$room" -gt 0 ] || { echo "error: the working tree and the wheels leave no room in a command's ${TRAVEL_MIB} MiB" >&2; exit 2; }
  local n=$((($(stat -c %s "$1") + room - 1) / room))
  echo $((n < 2 ? 2 : n))
}

stash_pieces() { # every piece this command carried, into $STASH
  local found=0 f
  mkdir -p "$STASH"
  for f in "$STAGE"/gguf.[0-9]*; do [ -f "$f" ] && cp "$f" "$STASH/" && found=1; done
  [ "$found" = 1 ] || { echo "error: no piece of the GGUF carried: carry .gpu_lend/gguf.<k> (run prepare first)" >&2; exit 2; }
}

command_1() { # stash piece 1 (and the packages), the gpu-marked tests
  mkdir -p "$OUT"
  stash_pieces
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
  stash_pieces
  local count k
  count=$(cat "$STAGE/gguf.count")
  for k in $(seq 1 "$count"); do
    [ -f "$STASH/gguf.$k" ] || { echo "error: $STASH/gguf.$k missing: the command that carries it has not run on this machine (a fresh start?); issue the commands back to back" >&2; exit 2; }
  done
  for k in $(seq 1 "$count"); do cat "$STASH/gguf.$k"; done >"$STASH/$GGUF_NAME"
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
  # the claims' first guess of an llm unit's time, seconds per run-step of one run as measured
  # just now: the ensemble's step over its runs (the gpu profile's units are compact ensembles:
  # a calibration's 4 step sizes, a rule's 8 seeds), else the fast run alone's, else today's
  # (runs side by side, as the study's workers run them); without any, llm.claims' own guess
  step_s=$("$PY" - "$OUT/throughput_k8.json" 2>/dev/null <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))["results"]
for path in ("ensemble", "fast", "today"):
    if path in r:
        print(r[path]["s_per_step"] / (r[path]["runs"] if path == "ensemble" else 1))
        break
EOF
) || step_s=""
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
K8_PATHS=${GPU_LEND_K8_PATHS:-ensemble,today,fast,trl}  # a failed path spares the rest
K16=16       # the second ensemble's size (its output stays throughput_k16.txt)
CLAIMS_S=${GPU_LEND_CLAIMS_S:-}  # a cap on the claims' budget (none: the time left; 0: no claims)
CLAIMS_SLACK=30  # the claims' limit beyond its budget: imports, the stop's grace (20 s), tables
case "${1:-}" in
  prepare) prepare ;;
  1) OUT=${OUT:?set OUT (the device tool sets it)}; command_1 ;;
  stash) stash_pieces; ls "$STASH" ;;
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
    # three pieces, each command holding only the one it carries (as the device tool's carry
    # does), so the middle piece's stash command runs too
    GPU_LEND_PIECES=3 prepare >/dev/null
    HOLD=$(mktemp -d)
    mv "$STAGE"/gguf.[0-9]* "$HOLD/"
    mv "$HOLD/gguf.1" "$STAGE/"
    START=$(date +%s) LIMIT=90; command_1
    rm "$STAGE/gguf.1" && mv "$HOLD/gguf.2" "$STAGE/" && stash_pieces
    rm "$STAGE/gguf.2" && mv "$HOLD/gguf.3" "$STAGE/"
    START=$(date +%s) LIMIT=${GPU_LEND_SECONDS:-$((BENCH_S + CLAIMS_S + MARGIN + 10))}; command_2
    rm -rf "$STASH" "$STAGE" "$HOLD"
    echo "dry run: results in $OUT"
    ;;
  *) echo "usage: benchmarks/gpu_lend.sh prepare | 1 | stash | 2 | dry-run" >&2; exit 2 ;;
esac
