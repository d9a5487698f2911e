#!/bin/sh
# gpu-bundle.sh: builds kvrepro here and packs what a GPU machine needs to
# run the CUDA suite and the GPU gate into gpu-bundle/ (git-ignored): the
# binaries plus every shared library they load except the system ones and
# the NVIDIA driver/runtime/cuBLAS (the GPU machine has those, but not HDF5,
# Check or cJSON). Carry gpu-bundle/ to the GPU machine and run
#   sh gpu-bundle/run-gpu-suite.sh
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
for t in "$BUILD"/tests/test_*; do
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

cat > "$OUT/run-gpu-suite.sh" <<'RUN'
#!/bin/sh
# Runs the CUDA tests, the test binaries and the gate from the bundle and
# prints a summary (device, driver, commit, results). Run from the repo root.
B=$(cd "$(dirname "$0")" && pwd)
# cuBLAS is not bundled (libcublasLt alone is ~500 MB): the GPU machine's
# CUDA toolkit provides it; its usual directory is the fallback.
export LD_LIBRARY_PATH="$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}:/usr/local/cuda/lib64"
export KVREPRO_SOURCE_DIR="${KVREPRO_SOURCE_DIR:-$(pwd)}"
echo "# kvrepro GPU run"
echo "commit: $(cat "$B/COMMIT")"
echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null \
    | sed 's/^/device: /' || echo "device: nvidia-smi unavailable"
nvcc --version 2>/dev/null | tail -1 | sed 's/^/nvcc: /'
fail=0
for t in "$B"/bin/test_*; do
    name=$(basename "$t")
    "$t" > "/tmp/$name.log" 2>&1
    rc=$?
    case $rc in
        0) echo "$name: passed" ;;
        77) echo "$name: SKIPPED ($(tail -1 "/tmp/$name.log"))" ;;
        *) echo "$name: FAILED (rc $rc)"; tail -20 "/tmp/$name.log"; fail=1 ;;
    esac
done
if [ -x "$B/bin/bench_cuda" ]; then
    # Numbers only (77 = skipped, no device): never part of the pass/fail.
    echo "--- bench_cuda --quick"
    "$B/bin/bench_cuda" --quick
    echo "bench_cuda exit code: $?"
fi
echo "--- kvrepro gate"
"$B/bin/kvrepro" gate
rc=$?
echo "gate exit code: $rc"
[ $rc -eq 0 ] || fail=1
# compute-sanitizer over a small CUDA-only gate: every variant, eager and
# graph, one scenario that crosses the window (racecheck is slow).
SMALL="gate --quiet --backends cuda --fixture mistral-tiny --scenarios prompt_w_plus_1 --repeats 1"
if command -v compute-sanitizer >/dev/null 2>&1; then
    for tool in memcheck racecheck; do
        echo "--- compute-sanitizer --tool $tool kvrepro $SMALL"
        # shellcheck disable=SC2086
        compute-sanitizer --tool "$tool" --error-exitcode 99 "$B/bin/kvrepro" $SMALL \
            > "/tmp/sanitizer-$tool.log" 2>&1
        src=$?
        tail -3 "/tmp/sanitizer-$tool.log"
        echo "compute-sanitizer $tool exit code: $src"
        [ $src -eq 0 ] || fail=1
    done
else
    echo "compute-sanitizer: not found on PATH (not run)"
    fail=1
fi
# The planted faults in their GPU form (information: which the gate catches).
echo "--- kvrepro gate --backends cuda --faults all (mistral-tiny)"
"$B/bin/kvrepro" gate --quiet --backends cuda --fixture mistral-tiny --faults all | tail -12
exit $fail
RUN
chmod +x "$OUT/run-gpu-suite.sh"
du -sh "$OUT"
echo "bundle ready: carry '$OUT' (device tool: carry=[\"$OUT\"]) and run: sh $OUT/run-gpu-suite.sh"
