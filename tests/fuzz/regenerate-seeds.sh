#!/bin/sh
# regenerate-seeds.sh: rewrites the generated seeds of the fuzz corpus,
# tests/fuzz/corpus/<target>/gen-* and fixture-*, from the current writers.
# Inputs the fuzzer found and that were kept (other names) are left alone.
#   tests/fuzz/regenerate-seeds.sh [BUILD_DIR]   (default: build)
# Needs the fuzz build (ctest -R fuzz_build, or the cmake line below).
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
cmake -S "$root/tests/fuzz" -B "$build/fuzz" -DCMAKE_C_COMPILER="$(command -v clang-14 || command -v clang)" >/dev/null
cmake --build "$build/fuzz" --target fuzz_make_seeds >/dev/null
corpus=$root/tests/fuzz/corpus
for t in config safetensors report report_edit; do
    mkdir -p "$corpus/$t"
    rm -f "$corpus/$t"/gen-* "$corpus/$t"/fixture-*
done
KV_FUZZ_TMPDIR=$build/fuzz/scratch "$build/fuzz/fuzz_make_seeds" "$corpus"
# The real checkpoints' configs (their safetensors are too large to mutate).
for f in gemma2 gemma3_text gpt_oss mistral qwen2; do
    cp "$root/fixtures/hf/$f/config.json" "$corpus/config/fixture-$f.json"
done
chmod 644 "$corpus"/*/*
echo "seeds written under $corpus"
