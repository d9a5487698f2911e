#!/bin/sh
# ensure-deps.sh: makes sure the Debian packages kvrepro builds against are
# installed. As root it installs what is missing (apt-get update, then
# apt-get install -y); otherwise it prints the exact command and exits 2, so
# `make gate` / `make test` never fail later with an obscure CMake error.
set -eu

# The fuzz tests (tests/fuzz) need clang with libFuzzer, which Debian
# bookworm ships in libclang-rt-14-dev (libclang_rt.fuzzer-x86_64.a), and
# llvm-symbolizer (llvm-14) for readable sanitizer stack traces.
PKGS="cmake pkg-config libcjson-dev check libhdf5-dev hdf5-tools libxml2-utils
      clang-14 libclang-rt-14-dev llvm-14"

if ! command -v dpkg-query >/dev/null 2>&1; then
    echo "kvrepro: no dpkg-query: this is not a Debian-like system." >&2
    echo "kvrepro: install by hand: $PKGS (and a C11 compiler, make)" >&2
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
