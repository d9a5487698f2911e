#!/bin/sh
# real_model.sh golden|variants|bf16 KVREPRO DIR [KVREPRO_HF]: the checks of
# tests/real_model.cmake.
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
bf16)
    hf="${4:-}"
    if [ ! -x "$hf" ]; then
        echo "skipped: no kvrepro-hf at '$hf': make test builds .venv (scripts/ensure-venv.sh)"
        exit 77
    fi
    p="$dir/prompts/a_repeated_beside_short.json"
    "$hf" capture --model "$dir" --prompts "$p" --max-new-tokens 24 --cache static_sliding \
        --mode eager,compile --attn eager,sdpa --dtype bf16 --threads 2 --out "$tmp/ok.h5" \
        > "$tmp/cap.log" 2>&1 || { cat "$tmp/cap.log"; echo "FAIL: capture"; exit 1; }
    "$hf" capture --model "$dir" --prompts "$p" --max-new-tokens 24 \
        --cache always_roll_off_by_one,index_copy_first_w --mode eager --attn eager \
        --dtype bf16 --threads 2 --out "$tmp/bad.h5" > "$tmp/cap.log" 2>&1 ||
        { cat "$tmp/cap.log"; echo "FAIL: capture"; exit 1; }
    "$kv" gate --model "$dir" --external "$tmp/ok.h5" --external "$tmp/bad.h5" --table \
        --report "$tmp/bf16.h5" > "$tmp/out" 2>&1
    rc=$?
    cat "$tmp/out"
    [ "$rc" = 1 ] || { echo "FAIL: exit $rc, expected 1 (the broken layers fail)"; exit 1; }
    for v in always_roll_off_by_one index_copy_first_w; do
        grep -q "vs hf:$v:eager:bf16/torch-cpu/eager/r0 reference: logits beyond max_rel_err" \
            "$tmp/out" || { echo "FAIL: $v was not caught"; exit 1; }
    done
    grep -q "^[0-9]* passed, 2 failed, 0 skipped" "$tmp/out" ||
        { echo "FAIL: a correct bf16 run failed"; exit 1; }
    h5dump -d /tolerances "$tmp/bf16.h5" | grep -q "bf16_spread@" ||
        { echo "FAIL: no bf16_spread@ row in the report"; exit 1; }
    echo "bf16: correct runs pass by the engine's own yardstick, both broken layers fail"
    exit 0
    ;;
*)
    echo "real_model.sh: unknown check '$what'" >&2
    exit 2
    ;;
esac
