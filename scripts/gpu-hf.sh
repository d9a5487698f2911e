#!/bin/sh
# gpu-hf.sh: the transformers lane on a GPU machine: transformers' own caches
# judged under eager, compile and reduce-overhead (CUDA graphs, where
# pytorch #159855's symptom shows), with their per-step times beside
# bench_cuda's. From the repository root:
#
#   KVREPRO=gpu-bundle/bin/kvrepro sh scripts/gpu-hf.sh FIXTURE_DIR OUTDIR
#
# It prints the versions and the device, captures transformers' greedy decode
# of the gate's left-padded batch (pytorch #159855's: W + W/32 tokens beside
# 10, 8 steps; `kvrepro-hf capture --scenario left_padded_batch` draws the ids
# the gate draws for FIXTURE_DIR) on CUDA, once per dtype, under each cache
# layer and mode with repeats, judges the captures with the C reference on the
# CPU (`kvrepro gate --external`) and prints one table: per dtype, cache layer
# and mode the agreement with the reference, compiled vs eager, whether the
# repeats are bitwise equal, the decode graphs over their budget, the
# recompiles, the steady per-step time (reduce-overhead: CUDA graph replays),
# the prefill and the compile time, the CUDA graphs recorded (a graph
# recorded again at every step leaves nothing to replay: the table says so).
# Every expensive step prints its duration
# and runs under timeout(1); a capture stopped by its timeout still writes the
# runs it completed (kvrepro-hf capture on SIGTERM).
#
# Knobs (environment; defaults sized for about 2.5 min on an H100 or H200
# with the gemma2 attn2b fixture, see the estimate below):
#   CACHES      cache layers (default static_sliding,always_roll; all five of
#               the issue: static_sliding,dynamic_sliding,cat_shift,roll,always_roll)
#   MODES       eager,compile,reduce-overhead (default eager,reduce-overhead)
#   DTYPES      space- or comma-separated (default "fp32 bf16")
#   REPEATS     runs per cache layer and mode (default 2; bitwise repeats need 2)
#   BF16_PAIR   the attention kernel of the bf16 yardstick's second eager run
#               (transformers' static_sliding beside attn eager, DESIGN §6;
#               gemma2 and sdpa: transformers 5.23 refuses it, 5.17 runs it
#               without the softcaps, 0.44 off in fp32 on the tiny fixture,
#               so flex_attention), or none (default flex_attention);
#               without it the gate judges bf16 by fp32's
#               yardstick, which fails them, saying so
#   CALIBRATE   1: the gate calibrates its tolerance per batch (3 reference
#               members and the fp64 shadow: ~5 reference decodes); 0:
#               --no-calibrate, the gate-wide max_rel_err 1e-4 (default 0:
#               stricter than the 1.7e-4 calibrated for attn2b on the CPU,
#               and bf16 is judged by its own yardstick either way)
#   TOL         with CALIBRATE=0, the gate's max_rel_err (--tol); empty: the
#               gate's 1e-4. The CPU-calibrated value for attn2b's
#               left_padded_batch is 0.000166044 (run-gpu-suite.sh's SEED_TOL)
#   SCENARIO    the gate scenario whose batch is captured (default
#               left_padded_batch)
#   HF_BUDGET_S the whole script's budget in seconds (default 210;
#               run-gpu-suite.sh's hf stage passes what is left of its own): each
#               step's timeout is its own limit below or what is left, a
#               capture's leaving T_GATE for the gate; a step with under 15 s
#               left is skipped, saying so
#   T_CAPTURE, T_PAIR, T_GATE   each step's own limit in seconds (default
#               240, 90, 60)
#   PYTHON      the interpreter (default python3); PYTHONPATH is kept after
#               this tree's python/ (a carried wheel's --target directory)
#   DEVICE      the capture's --device (default cuda; cpu to try the script
#               without a GPU: reduce-overhead runs are then skipped)
#
# Measured on an H200 (2026-11-27, docs/gpu-runs/2026-11-27-h200-b): with
# the defaults, each capture ran past the 120 s it then had, 7 of its 8
# runs done; bf16's flex_attention pair did not finish in 27 s. On the
# host, the probes' hashing costs a run about 3.6 s at this batch (8 steps
# of every layer's cache; measured on 2 CPU cores), a cold reduce-overhead
# compile 7 to 16 s, a warm one 1 to 2 s. The limits above are sized from
# that.
# Estimate as first written (each step prints its time,
# and the table each run's compile seconds): a capture process ~8 s to
# import torch and transformers, start CUDA and load the model; an eager run
# well under a second (its probes hash only the cache rows that changed); a
# torch.compile of one decode graph ~10-20 s cold (inductor and Triton, 16
# cores), ~3-5 s from the inductor caches after the per-run dynamo reset
# (repeats; on 2 CPU cores here a compile's first run took 23 s, its repeat
# 2 s); graphs per decode: always_roll 1; static_sliding 2 (transformers'
# StaticSlidingWindowLayer's host integer cumulative_length_int recompiles
# once, then is a dynamic integer), cat_shift and roll 2 (their host branch
# on `seen`), dynamic_sliding 2 (the 2-D mask's length). A dynamic integer
# or size under reduce-overhead may make cudagraph trees record a graph at
# every step: the table's cgN and its note say so, and such a run has no
# steady step to report. Defaults:
# per dtype ~8 + 2 + 3 graphs x ~15 + 2 x ~4 ~= 60 s, the bf16 pair ~25 s
# (flex_attention compiles its kernel), the gate ~20-25 s (the reference
# decode of the 4224 + 10 token batch: 62 s on 1 core here, 40 s on 2;
# calibrated, 5.4 min on 2). Together ~2.5-3 min; BF16_PAIR=none saves the
# pair, DTYPES=fp32 a capture. All five caches, three modes, five repeats:
# ~18 cold graphs and ~70 warm ones per dtype, ~8 min per dtype: split it
# (CACHES=..., one dtype a call).
#
# Exit: 0 every step ran and the gate passed, 1 the gate failed, 2 usage,
# 3 a step failed or timed out (the table is printed whatever happened).
set -u

usage() {
    echo "usage: KVREPRO=gpu-bundle/bin/kvrepro sh scripts/gpu-hf.sh FIXTURE_DIR OUTDIR" >&2
    exit 2
}
[ "$#" -eq 2 ] || usage
FIX=$1
OUT=$2
[ -f "$FIX/config.json" ] || { echo "gpu-hf: $FIX/config.json: missing (a fixture directory)" >&2; exit 2; }
KVREPRO=${KVREPRO:-gpu-bundle/bin/kvrepro}
PY=${PYTHON:-python3}
CACHES=${CACHES:-static_sliding,always_roll}
MODES=${MODES:-eager,reduce-overhead}
DTYPES=$(echo "${DTYPES:-fp32 bf16}" | tr ',' ' ')
REPEATS=${REPEATS:-2}
BF16_PAIR=${BF16_PAIR:-flex_attention}
CALIBRATE=${CALIBRATE:-0}
SCENARIO=${SCENARIO:-left_padded_batch}
DEVICE=${DEVICE:-cuda}
HF_BUDGET_S=${HF_BUDGET_S:-210}
T_CAPTURE=${T_CAPTURE:-240}
T_PAIR=${T_PAIR:-90}
T_GATE=${T_GATE:-60}
mkdir -p "$OUT" || exit 2
# an earlier call's files would pass for this one's
rm -f "$OUT/hf_fp32.h5" "$OUT/hf_bf16.h5" "$OUT/hf_bf16_pair.h5" "$OUT/gate_hf.h5" "$OUT/gate_hf.xml"

ROOT=$(cd "$(dirname "$0")/.." && pwd)   # this tree: its python/ is the package run
PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONPATH
HF_HUB_OFFLINE=1
TRANSFORMERS_OFFLINE=1
PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE TRANSFORMERS_OFFLINE PYTHONUNBUFFERED

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
STATUS=0
START=$(now)

# limit OWN RESERVE: the timeout of a step whose own limit is OWN, leaving
# RESERVE seconds of HF_BUDGET_S for the steps after it
limit() {
    awk -v own="$1" -v reserve="$2" -v total="$HF_BUDGET_S" -v a="$START" -v b="$(now)" 'BEGIN {
        left = int(total - (b - a) - reserve); print (left < own ? left : own) }'
}

# step NAME TIMEOUT CMD...: runs CMD under timeout, prints its duration and
# exit code; a failure or timeout sets STATUS 3 (the gate's own 1 is kept
# apart by the caller); under 15 s is no time: the step is skipped (exit 125)
step() {
    name=$1
    limit=$2
    shift 2
    if [ "$limit" -lt 15 ]; then
        echo "== $name: SKIPPED: ${limit} s left of HF_BUDGET_S=${HF_BUDGET_S} s"
        STATUS=3
        return 125
    fi
    echo "== $name (timeout ${limit} s)"
    t0=$(now)
    timeout -k 20 "$limit" "$@"
    rc=$?
    took=$(since "$t0")
    case $rc in
        0) echo "== $name: ${took} s" ;;
        124|137) echo "== $name: TIMEOUT after ${took} s (limit ${limit} s)"; STATUS=3 ;;
        *) echo "== $name: exit $rc after ${took} s" ;;
    esac
    return $rc
}

echo "== versions"
"$PY" - <<'EOF' || STATUS=3
import platform, torch, transformers
print(f"python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda}, "
      f"cuDNN {torch.backends.cudnn.version()}), transformers {transformers.__version__}")
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(f"device: {p.name}, {p.total_memory / 2**30:.0f} GiB, capability {p.major}.{p.minor}, "
          f"{torch.cuda.device_count()} device(s)")
else:
    print("device: no CUDA device visible to torch")
EOF
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
"$KVREPRO" version 2>&1 | head -1
echo "fixture $FIX: $(tr -d '\n\t' < "$FIX/config.json" | sed 's/  */ /g' | cut -c1-400)"
echo "device $DEVICE; caches $CACHES; modes $MODES; dtypes $DTYPES; repeats $REPEATS; bf16 pair $BF16_PAIR;" \
    "calibrate $CALIBRATE; tol ${TOL:-gate default}; budget $HF_BUDGET_S s (capture $T_CAPTURE, pair $T_PAIR, gate $T_GATE)"

CAPTURES=""
for d in $DTYPES; do
    f="$OUT/hf_$d.h5"
    step "capture $d" "$(limit "$T_CAPTURE" "$T_GATE")" "$PY" -m kvrepro.cli capture --model "$FIX" --scenario "$SCENARIO" \
        --device "$DEVICE" --mode "$MODES" --repeats "$REPEATS" --cache "$CACHES" --dtype "$d" --out "$f" || STATUS=3
    [ -f "$f" ] && CAPTURES="$CAPTURES $f"
    if [ "$d" = bf16 ] && [ "$BF16_PAIR" != none ]; then
        # the yardstick's second kernel: transformers' static_sliding, bf16
        # eager; with attn eager too unless the capture above has that run
        # (a run label in two files is refused by the gate)
        attn=$BF16_PAIR
        case ",$CACHES," in *,static_sliding,*) ;; *) attn="eager,$BF16_PAIR" ;; esac
        case ",$MODES," in *,eager,*) ;; *) attn="eager,$BF16_PAIR" ;; esac
        p="$OUT/hf_bf16_pair.h5"
        step "capture bf16 yardstick pair ($attn)" "$(limit "$T_PAIR" "$T_GATE")" "$PY" -m kvrepro.cli capture --model "$FIX" \
            --scenario "$SCENARIO" --device "$DEVICE" --mode eager --repeats 1 --cache static_sliding --attn "$attn" \
            --dtype bf16 --out "$p" || STATUS=3
        [ -f "$p" ] && CAPTURES="$CAPTURES $p"
    fi
done

GATE_RC=0
if [ -n "$CAPTURES" ]; then
    set --
    for f in $CAPTURES; do set -- "$@" --external "$f"; done
    [ "$CALIBRATE" = 1 ] || set -- "$@" --no-calibrate
    [ "$CALIBRATE" = 1 ] || [ -z "${TOL:-}" ] || set -- "$@" --tol "max_rel_err=$TOL"
    step "gate --external (CPU reference, $(nproc) cores)" "$(limit "$T_GATE" 0)" "$KVREPRO" gate --model "$FIX" "$@" \
        --report "$OUT/gate_hf.h5" --junit "$OUT/gate_hf.xml"
    GATE_RC=$?
    case $GATE_RC in 0|1) ;; *) STATUS=3 ;; esac
    echo "== table"
    if [ -f "$OUT/gate_hf.h5" ]; then
        # shellcheck disable=SC2086
        "$PY" -m kvrepro.cli table $CAPTURES --gate "$OUT/gate_hf.h5" || STATUS=3
    else
        # shellcheck disable=SC2086
        "$PY" -m kvrepro.cli table $CAPTURES || STATUS=3
    fi
else
    echo "gpu-hf: no capture was written" >&2
    STATUS=3
fi
echo "== gpu-hf: $(since "$START") s in all"
[ "$STATUS" -ne 0 ] && exit "$STATUS"
[ "$GATE_RC" -eq 1 ] && exit 1
exit 0
