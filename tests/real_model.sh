#!/bin/sh
# real_model.sh golden|variants KVREPRO DIR: the checks of tests/real_model.cmake.
set -u
what="$1" kv="$2" dir="$3"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
if [ "$what" = mode ]; then
    # expect RC CMD...: runs CMD, fails the test unless it exits RC
    expect() {
        want="$1"; shift
        "$@" > "$tmp/out" 2>&1
        rc=$?
        if [ "$rc" != "$want" ]; then
            cat "$tmp/out"
            echo "FAIL: exit $rc, expected $want: $*"
            exit 1
        fi
    }
    g="$dir/golden.h5"
    expect 0 "$kv" gate --model "$dir" --golden "$g" --report "$tmp/ok.h5"
    grep -q "0 failed" "$tmp/out" || { cat "$tmp/out"; echo "FAIL: no '0 failed'"; exit 1; }
    expect 1 "$kv" gate --model "$dir" --golden "$g" --tol max_rel_err=1e-12 --quiet
    grep -q "golden: logits beyond max_rel_err" "$tmp/out" || { cat "$tmp/out"; echo "FAIL: no golden failure line"; exit 1; }
    expect 2 "$kv" gate --golden "$g"
    expect 2 "$kv" gate --fixture mistral-tiny --golden "$g"
    expect 2 "$kv" gate --model "$dir" --golden "$g" --variants ring
    expect 2 "$kv" gate --model "$dir" --golden "$g" --external "$g"
    expect 2 "$kv" gate --model "$dir" --golden "$g" --golden "$g"
    expect 2 "$kv" gate --model "$dir" --golden "$tmp/missing.h5"
    expect 2 "$kv" gate --model "$dir" --golden "$dir/config.json"
    [ ! -e "$tmp/ok.h5.tmp" ] || { echo "FAIL: a temporary was left"; exit 1; }
    echo "golden mode: passes, fails below its error, refuses what it cannot honour"
    exit 0
fi
if [ ! -f "$dir/golden.h5" ] || [ ! -f "$dir/model.safetensors" ]; then
    echo "skipped: no real model in $dir: make test fetches it (scripts/ensure-real-model.sh)"
    exit 77
fi
case "$what" in
golden)
    "$kv" gate --model "$dir" --golden "$dir/golden.h5" --report "$tmp/golden.h5"
    ;;
variants)
    # the (a) batch's rows, unpadded, from the set-up (fixtures/real/generate.py --prompts-dir)
    "$kv" gate --model "$dir" --prompts "$dir/prompts/a_repeated_beside_short.json" \
        --max-new-tokens 24 --backends cpu --repeats 1 --no-calibrate --tol max_rel_err=0 \
        --report "$tmp/variants.h5"
    ;;
*)
    echo "real_model.sh: unknown check '$what'" >&2
    exit 2
    ;;
esac
