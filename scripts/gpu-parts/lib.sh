# Helpers of scripts/gpu-machine.sh and its parts (sourced; uses OUT and sets rc).
#
# logged LOG SECONDS LINES DROP NAME CMD...: runs CMD for at most SECONDS, appends its whole
# output to LOG, prints its last LINES lines without those matching the extended regex DROP,
# and sets rc=1 (naming NAME) when CMD fails or is cut off.
logged() {
  local log=$1 limit=$2 lines=$3 drop=$4 name=$5 r tmp
  shift 5
  tmp=$(mktemp "$OUT/.logged.XXXXXX")
  echo "--- $name: $*" | tee -a "$log"
  timeout "$limit" "$@" >"$tmp" 2>&1
  r=$?
  cat "$tmp" >>"$log"
  grep -vE "$drop" "$tmp" | tail -n "$lines" || true
  rm -f "$tmp"
  if [ "$r" -ne 0 ]; then
    echo "FAILED (exit $r): $name" | tee -a "$log"
    rc=1
  fi
}

# table_rows LOG NAME FIELDS CMD...: prints "== NAME", runs CMD through logged (120 s, its
# whole output appended to LOG, rc set on failure), then the table rows of its output folded
# onto one line (FIELDS: what awk prints of each row, e.g. '$1, $5'), then its FAILED and
# validation lines on one line.
table_rows() {
  local log=$1 name=$2 fields=$3 tmp
  shift 3
  tmp=$(mktemp "$OUT/.rows.XXXXXX")
  echo "== $name"
  logged "$log" 120 40 "^[0-9T:.-]+Z |^bench_engine: op|^bench_copy: |^note:|MsgSize" "$name" "$@" >"$tmp"
  grep -E "^ +[0-9]+ +[0-9]+ " "$tmp" | awk "{print $fields}" | tr '\n' ';'
  echo
  grep -E "^FAILED|validation" "$tmp" | tr '\n' ' '
  echo
  rm -f "$tmp"
}

# events_then_flags RUN NAME JSON CMD...: runs CMD through RUN (a part's logger) twice, the
# copy pools' completions told by events (MORI_GPU_POOL_FLAGS=0), then by flags (=1), named
# "NAME, events" and "NAME, flags"; unless JSON is -, each run also writes --json JSON-events.json
# or JSON-flags.json.
events_then_flags() {
  local run=$1 name=$2 json=$3 mode v
  shift 3
  for mode in events flags; do
    v=0
    [ "$mode" = flags ] && v=1
    if [ "$json" = - ]; then
      "$run" "$name, $mode" env MORI_GPU_POOL_FLAGS=$v "$@"
    else
      "$run" "$name, $mode" env MORI_GPU_POOL_FLAGS=$v "$@" --json "$json-$mode.json"
    fi
  done
}

# The lines of a bench_dispatch_combine run a part's summary leaves out: the per-rank lines
# and table frame (rank 0's row is kept), the description and trace-file lines, the timing
# legend and the host CPU line. A part adds its own (extended regex alternatives).
EP_RUN_DROP='^$|^rank |^┌|^└|^╞|^│ rank|^│ [1-7] |^mori_ep::gpu_internode|^trace: [0-9]+ files|^times:|^host CPU'

# The decode shape of the inter-node EP figures (T = 128, H = 7168, E = 256, top-8, bf16).
EP_DEC="--num-tokens 128 --hidden 7168 --num-experts 256 --top-k 8 --dtype bf16"

# ep_logged LOG LINES EXTRA NAME CMD...: logged with 300 s, LINES lines and EP_RUN_DROP plus
# EXTRA (more alternatives, or empty).
ep_logged() {
  local log=$1 lines=$2 extra=$3
  shift 3
  logged "$log" 300 "$lines" "$EP_RUN_DROP${extra:+|$extra}" "$@"
}

# ep_ab RUN PREV NAME ORDER ARGS...: bench_dispatch_combine ARGS --device-api through RUN (a
# part's logger), once per letter of ORDER: p the earlier build PREV (skipped when empty), m
# an intermediate build ($B/bench_dispatch_combine_mid, skipped when absent), n this one
# ($B/bench_dispatch_combine); named "NAME, earlier build" / "NAME, intermediate build" /
# "NAME, this build".
ep_ab() {
  local run=$1 prev=$2 name=$3 order=$4 x
  shift 4
  for x in $(echo "$order" | grep -o .); do
    case $x in
      p) [ -n "$prev" ] && "$run" "$name, earlier build" "$prev" "$@" --device-api ;;
      m) [ -x "$B/bench_dispatch_combine_mid" ] && "$run" "$name, intermediate build" "$B/bench_dispatch_combine_mid" "$@" --device-api ;;
      n) "$run" "$name, this build" "$B/bench_dispatch_combine" "$@" --device-api ;;
    esac
  done
}

# ep_env_ab RUN NAME ORDER VAR ARGS...: this build's bench_dispatch_combine ARGS --device-api
# through RUN once per character of ORDER (0 or 1), with VAR set to it; named "NAME, VAR=x".
ep_env_ab() {
  local run=$1 name=$2 order=$3 var=$4 x
  shift 4
  for x in $(echo "$order" | grep -o .); do
    "$run" "$name, $var=$x" env "$var=$x" "$B/bench_dispatch_combine" "$@" --device-api
  done
}

# ep_prev LOG: sets prev to the earlier build's bench_dispatch_combine
# ($B/bench_dispatch_combine_prev, carried beside the bundle), or to nothing after logging its
# absence to LOG and setting rc=1.
ep_prev() {
  prev="$B/bench_dispatch_combine_prev"
  [ -x "$prev" ] && return
  echo "FAILED: $prev is missing (carry the earlier build's binary)" | tee -a "$1"
  prev=""
  rc=1
}

# ep_targets LOG DEC: the inter-node EP targets' baselines, appended to LOG: bench_proxy round
# trips over xgmi and tcp (8 B and the decode legs' 1.21 MB), bench_engine batch-1 xgmi writes
# at the legs' sizes, and the intranode kernels at 8 ranks for the shape DEC.
ep_targets() {
  local log=$1
  shift
  logged "$log" 120 8 "^$" "bench_proxy xgmi" "$B/bench_proxy" --transport xgmi --sizes 8,1213632 --iters 100 --flood-bytes 0
  logged "$log" 120 8 "^$" "bench_proxy tcp" "$B/bench_proxy" --transport tcp --sizes 8,1213632 --iters 50 --flood-bytes 0
  logged "$log" 120 12 "^[0-9T:.-]+Z |^note:" "bench_engine xgmi write, leg sizes" "$B/bench_engine" --local --backend xgmi --mem-type gpu --op write --enable-sess --transfer-batch-size 1 --all --sweep-start 262144 --sweep-max 4194304 --iters 200 --warmup-iters 20 --log-level warning
  logged "$log" 120 8 "^$" "intranode decode, 8 ranks on one GPU" "$B/bench_dispatch_combine" "$@"
}

# ep_tests LOG PART: the inter-node EP GPU tests (all three schemes, xgmi and tcp legs,
# bit-exact, the device calls) as PART's first step, appended to LOG.
ep_tests() {
  step "$2: inter-node EP GPU tests"
  logged "$1" 300 20 "^$" "ep internode GPU tests" "$B/ep_internode_gpu" --ignored --test-threads=1
}

# ep_rounds RUN PART ORDERS NAME ARGS...: ep_ab through RUN once per word of ORDERS (the
# builds' orders, rotating), each a step of PART named "NAME (round)"; PREV from ep_prev.
ep_rounds() {
  local run=$1 part=$2 orders=$3 name=$4 round=0 order
  shift 4
  for order in $orders; do
    round=$((round + 1))
    step "$part: round $round: $name"
    ep_ab "$run" "$prev" "$name ($round)" "$order" "$@"
  done
}

# ep_trace_all RUN NAME STEM ARGS...: this build's bench_dispatch_combine ARGS --device-api
# --trace through RUN, every rank's Perfetto file (one clock) kept as $OUT/STEM.rankR.json.
ep_trace_all() {
  local run=$1 name=$2 stem=$3 dir f
  shift 3
  dir=$(mktemp -d)
  "$run" "$name" "$B/bench_dispatch_combine" "$@" --device-api --trace "$dir/al.json"
  for f in "$dir"/al.rank*.json; do [ -f "$f" ] && cp "$f" "$OUT/$stem.${f##*/al.}"; done
  rm -rf "$dir"
}
