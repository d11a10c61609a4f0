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
