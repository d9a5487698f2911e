#!/bin/sh
# gpu-bundle.sh: builds kvrepro here and packs what a GPU machine needs to
# run the CUDA suite and the GPU gate into gpu-bundle/ (git-ignored): the
# binaries plus every shared library they load except the system ones and
# the NVIDIA driver/runtime/cuBLAS (the GPU machine has those, but not HDF5,
# Check or cJSON), with scripts/run-gpu-suite.sh. Carry gpu-bundle/ to the
# GPU machine and run
#   sh gpu-bundle/run-gpu-suite.sh [STAGE...]
# from the repository root; it prints a summary to commit under docs/gpu-runs/.
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
OUT=gpu-bundle

./scripts/ensure-deps.sh
cmake -S . -B "$BUILD" >/dev/null
cmake --build "$BUILD" -j 2 >/dev/null

rm -rf "$OUT"
mkdir -p "$OUT/bin" "$OUT/lib"
bins="$BUILD/kvrepro $BUILD/bench_decode"
# The CUDA benchmark exists only in a build with nvcc.
if [ -x "$BUILD/bench_cuda" ]; then bins="$bins $BUILD/bench_cuda"; fi
# The *_san builds are CPU tests under ASan, which does not mix with the
# CUDA driver and would carry 11 MB of sanitizer runtimes: left out.
# BUNDLE_TESTS=cuda keeps only the CUDA test binaries (the suite's default
# stages run no other), room for the working tree under the device tool's
# 64 MiB.
for t in "$BUILD"/tests/test_*; do
    case "$t" in *_san) continue ;; esac
    if [ "${BUNDLE_TESTS:-all}" = cuda ]; then
        case "$(basename "$t")" in test_cuda_*) ;; *) continue ;; esac
    fi
    [ -x "$t" ] && bins="$bins $t"
done
for b in $bins; do
    cp "$b" "$OUT/bin/"
    # Libraries the loader resolves here; leave out libc and friends and the
    # NVIDIA stack, which the GPU machine provides in matching versions.
    ldd "$b" | awk '/=> \// {print $3}' | while read -r lib; do
        case "$(basename "$lib")" in
            libc.so*|libm.so*|libdl.so*|librt.so*|libpthread.so*|ld-linux*|libcuda.so*|\
            libcudart.so*|libcublas*|libnvidia*) ;;
            *) cp -nL "$lib" "$OUT/lib/" ;;
        esac
    done
done
git rev-parse HEAD > "$OUT/COMMIT" 2>/dev/null || echo unknown > "$OUT/COMMIT"

cp scripts/run-gpu-suite.sh "$OUT/run-gpu-suite.sh"
chmod +x "$OUT/run-gpu-suite.sh"
du -sh "$OUT"
echo "bundle ready: carry '$OUT' (device tool: carry=[\"$OUT\"]) and run: sh $OUT/run-gpu-suite.sh"
