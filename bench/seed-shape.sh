#!/bin/sh
# seed-shape.sh: the seed bug report's shape on the CPU reference (pytorch #159855's shape).
#
# The report ran google/gemma-2-2b (window W = 4096) on a left-padded batch
# of 2 (one 4,200-token prompt, one short one) for 20 new tokens. This runs
# that shape through bench_decode on a synthetic checkpoint of gemma-2-2b's
# exact dimensions (random weights; `kvrepro fixture --size 2b`, 5.2 GB in
# BF16, written if DIR lacks it) and prints the wall time and the peak RSS.
# The goal: under 10 minutes on 2 cores, peak RSS under 16 GB.
#
# usage: bench/seed-shape.sh [DIR]        (or KV_SEED_DIR=DIR)
#   DIR holds (or receives) the checkpoint: put it outside the repository
#   (e.g. /tmp/gemma2-2b), never commit it. The fixture command checks the
#   free space first (5.2 GB) and writes nothing on failure.
# Environment (defaults are the seed's shape):
#   KV_SEED_PROMPT_LEN  long prompt, tokens            (4200)
#   KV_SEED_SHORT_LEN   short prompt's real tokens     (1000)
#   KV_SEED_NEW_TOKENS  new tokens per row             (20)
#   KV_SEED_THREADS     OpenMP threads                 (2)
#   KV_BUILD            build directory                (build, beside this script's bench/)
# A shorter KV_SEED_PROMPT_LEN (e.g. 300, with KV_SEED_SHORT_LEN=100) checks
# the pipeline at the real dimensions in a few minutes.
# Exit: 0 ran, 2 bad input (no checkpoint and none could be written, a
# window other than 4096, missing binaries), else bench_decode's status.
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
build=${KV_BUILD:-$root/build}
kvrepro=$build/kvrepro
bench=$build/bench_decode
dir=${1:-${KV_SEED_DIR:-}}
prompt_len=${KV_SEED_PROMPT_LEN:-4200}
short_len=${KV_SEED_SHORT_LEN:-1000}
new_tokens=${KV_SEED_NEW_TOKENS:-20}
threads=${KV_SEED_THREADS:-2}
seed_window=4096

if [ -z "$dir" ]; then
    echo "seed-shape.sh: no checkpoint directory: pass DIR or set KV_SEED_DIR" >&2
    exit 2
fi
for bin in "$kvrepro" "$bench"; do
    if [ ! -x "$bin" ]; then
        echo "seed-shape.sh: $bin: not built (cmake -S . -B build && cmake --build build)" >&2
        exit 2
    fi
done
for v in "$prompt_len" "$short_len" "$new_tokens" "$threads"; do
    case $v in
    '' | *[!0-9]*)
        echo "seed-shape.sh: expected a positive integer in KV_SEED_*, found '$v'" >&2
        exit 2
        ;;
    esac
done

if [ ! -f "$dir/config.json" ] || [ ! -f "$dir/model.safetensors" ]; then
    echo "seed-shape.sh: writing the synthetic gemma-2-2b checkpoint to $dir (5.2 GB, BF16)"
    # exit 2 with the reason (unwritable DIR, too little free space) and
    # nothing half-written; the load check afterwards needs ~10.5 GB of RAM
    "$kvrepro" fixture --family gemma2 --size 2b --out "$dir" || exit 2
fi

# The shape is the seed's only with its window: refuse another checkpoint's.
window=$(tr -d ' \t\r\n' <"$dir/config.json" | sed -n 's/.*"sliding_window":\([0-9]*\).*/\1/p')
if [ "$window" != "$seed_window" ]; then
    echo "seed-shape.sh: $dir/config.json: sliding_window: expected $seed_window (the seed's" \
        "window), found '${window:-none}'" >&2
    exit 2
fi

log=$(mktemp "${TMPDIR:-/tmp}/seed-shape.XXXXXX")
trap 'rm -f "$log"' EXIT
echo "seed-shape.sh: $dir, window $window, batch 2 (prompt $prompt_len tokens; short row" \
    "$short_len real tokens, left-padded), $new_tokens new tokens, $threads threads"
start=$(date +%s)
rc=0
OMP_NUM_THREADS=$threads "$bench" --model "$dir" --once --threads "$threads" --batch 2 \
    --prompt-len "$prompt_len" --short-len "$short_len" --new-tokens "$new_tokens" \
    >"$log" 2>&1 || rc=$?
end=$(date +%s)
cat "$log"
if [ "$rc" -ne 0 ]; then
    echo "seed-shape.sh: bench_decode failed (exit $rc)" >&2
    exit "$rc"
fi
run=$(sed -n 's/.*one full decode .* \([0-9.]*\) s$/\1/p' "$log")
rss=$(sed -n 's/^peak RSS: \([0-9.]*\) GiB.*/\1/p' "$log")
echo "seed shape: wall $((end - start)) s (load + decode; the decode alone ${run:-?} s)," \
    "peak RSS ${rss:-?} GiB"
