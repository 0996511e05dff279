# Sourced by the GPU chains (multi_gpu_runs.sh, two_gpu_runs.sh, issue33_runs.sh): ts, and
# one NAME GPUS THREADS SCRIPT ARGS...: a benchmark on those GPUs in its own $OUT, its stdout
# to $RUNS/NAME.log, its JSON copied to $OUT/NAME_<file> as soon as it ends (a chain cut off
# later keeps what the earlier runs wrote); RUN_LIMIT seconds at most (default 600).
RUNS=${DEVICE_RUNS:-/tmp/runs}
OUT=${OUT:?OUT: where the JSON goes}
ts() { date +%H:%M:%S; }
one() {
  local name=$1 gpus=$2 threads=$3; shift 3
  local work="$RUNS/w_$name"
  mkdir -p "$work"
  echo "[$(ts)] start $name on GPUs $gpus: $*"
  CUDA_VISIBLE_DEVICES=$gpus OMP_NUM_THREADS=$threads OUT=$work timeout "${RUN_LIMIT:-600}" \
    python "$@" > "$RUNS/$name.log" 2>&1
  local rc=$?
  for f in "$work"/*.json; do [ -f "$f" ] && cp "$f" "$OUT/${name}_$(basename "$f")"; done
  echo "[$(ts)] end $name rc=$rc"
}
