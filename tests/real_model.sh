#!/bin/sh
# real_model.sh golden|variants KVREPRO DIR: the checks of tests/real_model.cmake.
set -u
what="$1" kv="$2" dir="$3"
if [ ! -f "$dir/golden.h5" ] || [ ! -f "$dir/model.safetensors" ]; then
    echo "skipped: no real model in $dir: make test fetches it (scripts/ensure-real-model.sh)"
    exit 77
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
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
