#!/bin/sh
# ensure-deps.sh [gate|test|slurm]: makes sure the Debian packages a set-up
# needs are installed. As root it installs what is missing (apt-get update,
# then apt-get install -y); otherwise it prints the exact command and exits 2,
# so `make gate` / `make test` never fail later with an obscure CMake error.
#   gate   what `make gate` needs to build and run the kvrepro binary, and
#          nothing else: a C compiler, CMake, cJSON and HDF5
#   test   (the default) the gate's set plus what the test suite uses
#          (`make test`)
#   slurm  the gate's set, Check and a single-node Slurm (`make slurm-check`)
set -eu

# The gate: the binary's build and run dependencies (KV_BUILD_TESTS=OFF,
# target kvrepro only).
GATE_PKGS="gcc libc6-dev cmake pkg-config libcjson-dev libhdf5-dev"
# The test suite: Check (the C test suites), h5dump (hdf5-tools) and xmllint
# (libxml2-utils), which the report and JUnit tests read their files back
# with; Python 3 and its venv module for the transformers lane's environment
# (.venv/, scripts/ensure-venv.sh); the fuzz tests (tests/fuzz) need clang
# with libFuzzer, which Debian bookworm ships in libclang-rt-14-dev
# (libclang_rt.fuzzer-x86_64.a), and llvm-symbolizer (llvm-14) for readable
# sanitizer stack traces; chromium, run headless by the HTML report's test to
# render the page (the test skips, saying so, without it).
TEST_PKGS="check hdf5-tools libxml2-utils python3 python3-venv
           clang-14 libclang-rt-14-dev llvm-14 chromium"
# The Slurm test (tests/slurm.sh, label slurm): slurmctld and slurmd
# (slurm-wlm) and munged, started by the test itself.
SLURM_PKGS="slurm-wlm munge"

case "${1:-test}" in
    gate) PKGS="$GATE_PKGS" ;;
    test) PKGS="$GATE_PKGS $TEST_PKGS" ;;
    slurm) PKGS="$GATE_PKGS check $SLURM_PKGS" ;;
    *) echo "usage: $0 [gate|test|slurm]" >&2; exit 2 ;;
esac
PKGS=$(echo $PKGS)  # one line, for the messages

if ! command -v dpkg-query >/dev/null 2>&1; then
    echo "kvrepro: no dpkg-query: this is not a Debian-like system." >&2
    echo "kvrepro: install by hand: $PKGS (and make)" >&2
    exit 2
fi

missing=""
for p in $PKGS; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $p"
    fi
done
[ -z "$missing" ] && exit 0

cmd="apt-get update && apt-get install -y$missing"
if [ "$(id -u)" -ne 0 ]; then
    echo "kvrepro: missing Debian packages:$missing" >&2
    echo "kvrepro: run as root:  $cmd" >&2
    exit 2
fi

echo "kvrepro: installing missing Debian packages:$missing" >&2
if ! apt-get update -q >&2; then
    echo "kvrepro: apt-get update failed; run as root:  $cmd" >&2
    exit 2
fi
# shellcheck disable=SC2086 # word splitting of the package list is intended
if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q $missing >&2; then
    echo "kvrepro: apt-get install failed; run as root:  $cmd" >&2
    exit 2
fi
