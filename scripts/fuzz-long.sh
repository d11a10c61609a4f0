#!/usr/bin/env bash
# Runs every fuzz target binary in BIN_DIR at once, each for SECONDS, on a machine without
# Rust (the binaries come from `cargo xtask fuzz --build-only --out BIN_DIR`; docs/FUZZING.md).
#
#   bash fuzz-long.sh BIN_DIR SECONDS CORPUS_DIR
#
# Each target's corpus is CORPUS_DIR/<target>/ (seeded by the binary's --write-seeds, kept
# between runs), its crash reproducers and log go to CORPUS_DIR/_artifacts/<target>/. One
# summary line per target goes to stdout and to CORPUS_DIR/summary.txt:
#   target=NAME seconds=S executions=N exec_per_s=N cov=N ft=N corpus=N crashes=0|1 [reproducer=PATH]
# The exit status is 1 when any target crashed (or did not run), else 0.
set -u
if [ $# -ne 3 ]; then
    echo "usage: bash $0 BIN_DIR SECONDS CORPUS_DIR" >&2
    exit 2
fi
bin_dir=$1 seconds=$2 corpus=$3
case $seconds in '' | *[!0-9]*) echo "SECONDS must be a whole number" >&2; exit 2 ;; esac
mkdir -p "$corpus" || exit 2
corpus=$(cd "$corpus" && pwd)
bin_dir=$(cd "$bin_dir" && pwd)

targets=()
for b in "$bin_dir"/*; do
    [ -f "$b" ] && [ -x "$b" ] && [ "${b%.sh}" = "$b" ] && targets+=("$(basename "$b")")
done
[ ${#targets[@]} -gt 0 ] || { echo "no fuzz target binary in $bin_dir" >&2; exit 2; }
echo "fuzz-long: ${#targets[@]} targets for $seconds s each, all at once ($(nproc) cores): ${targets[*]}"

pids=()
for t in "${targets[@]}"; do
    mkdir -p "$corpus/$t" "$corpus/_artifacts/$t"
    # (libFuzzer's start-up warnings about the sanitizer hooks go to seed.log; docs/FUZZING.md)
    "$bin_dir/$t" --write-seeds "$corpus/$t" >/dev/null 2>"$corpus/_artifacts/$t/seed.log" || echo "$t: --write-seeds failed" >&2
    "$bin_dir/$t" --write-dict "$corpus/_artifacts/$t/dict" >/dev/null 2>>"$corpus/_artifacts/$t/seed.log"
    dict=()
    [ -s "$corpus/_artifacts/$t/dict" ] && dict=("-dict=$corpus/_artifacts/$t/dict")
    "$bin_dir/$t" "$corpus/$t" -max_total_time="$seconds" -timeout=30 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="$corpus/_artifacts/$t/" "${dict[@]}" </dev/null >"$corpus/_artifacts/$t/fuzz.log" 2>&1 &
    pids+=($!)
done

failed=0
: >"$corpus/summary.txt"
for i in "${!targets[@]}"; do
    t=${targets[$i]}
    wait "${pids[$i]}"
    rc=$?
    log=$corpus/_artifacts/$t/fuzz.log
    execs=$(sed -n 's/^stat::number_of_executed_units: *\([0-9]*\).*/\1/p' "$log" | tail -1)
    eps=$(sed -n 's/^stat::average_exec_per_sec: *\([0-9]*\).*/\1/p' "$log" | tail -1)
    cov=$(grep '^#.* cov: ' "$log" | tail -1 | sed -n 's/.* cov: \([0-9]*\).*/\1/p')
    ft=$(grep '^#.* ft: ' "$log" | tail -1 | sed -n 's/.* ft: \([0-9]*\).*/\1/p')
    n=$(find "$corpus/$t" -maxdepth 1 -type f | wc -l)
    crashes=0 extra=
    if [ "$rc" -ne 0 ]; then
        crashes=1 failed=1
        repro=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)
        extra=" reproducer=${repro:-none} log=$log"
    fi
    line="target=$t seconds=$seconds executions=${execs:-0} exec_per_s=${eps:-0} cov=${cov:-0} ft=${ft:-0} corpus=$n crashes=$crashes$extra"
    echo "$line" | tee -a "$corpus/summary.txt"
done
exit $failed
