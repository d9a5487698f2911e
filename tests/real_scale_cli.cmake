# real_scale_cli.cmake: the real-scale gate from the command line
# (registered from CMakeLists.txt): a tiny model written at a real model's
# window by `fixture --sliding-window`, its work line naming every decode by
# kind with an estimated wall time, progress lines inside a run (not only
# when one ends) when the log interval is short, the model's one
# calibration named in the report, a matrix beyond the memory limit refused,
# and the bad values refused with exit 2.
include(${CMAKE_CURRENT_LIST_DIR}/cli_helpers.cmake)
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")

kv_run(0 out err ${KVREPRO} fixture --family mistral --out "${WORK}/m" --sliding-window 128)
kv_expect_match("${out}" "short_prompt_crosses_window: batch 1, prompt 120 tokens[^\n]*16 new tokens, window 128"
                "the fixture's default decode is the real-scale one")

set(ENV{KVREPRO_PROGRESS_EVERY} 0)
kv_run(0 out err ${KVREPRO} gate --model "${WORK}/m" --scenarios short_prompt_crosses_window,prompt_w
       --variants ring --modes eager --repeats 1 --backends cpu --report "${WORK}/g.h5")
kv_expect_match("${out}" "work: [0-9]+ cpu decodes \\(2 reference, 0 fresh twin, 0 calibration member, 1 fp64 shadow, 2 candidate taking the reference's first prefill forward, 1 shared prefill stream \\(the references' first rows, cut from it\\)\\), [0-9]+ token positions, ~[0-9.e+]+ GFLOP; estimated [0-9]+ min [0-9]+ s and ~[0-9.]+ GiB of memory on this machine"
                "the work line names each kind of decode and the estimate")
kv_expect_match("${out}" "calibration: [^\n]*/m: the 3 reduction-order members are not run: no comparison of this gate is judged by a tolerance"
                "a CPU-only gate says why it runs no calibration member")
kv_expect_match("${err}" "now m stream: one prefill of 128 tokens, cut for 2 references"
                "the shared prefill named in the progress")
kv_expect_match("${err}" "now m stream: one prefill of 128 tokens \\(layer 1 of [0-9]+\\)"
                "progress inside the shared prefill, layer by layer")
kv_expect_match("${err}" "now m short_prompt_crosses_window fp64 shadow \\(row 1 of 1, layer 1 of [0-9]+\\)"
                "progress inside the fp64 shadow, layer by layer")
kv_expect_match("${err}" "kvrepro gate: [0-9]+/[0-9]+ runs, [0-9]+s elapsed, ETA [0-9]+s; now m short_prompt_crosses_window reference/cpu/eager/r0 \\(step [1-9]"
                "a progress line inside the reference's run")
# --first-catch: the ETA is a bound (the fault passes stop early), and a
# fault pass's run is named with its fault
kv_run(0 out err ${KVREPRO} gate --model "${WORK}/m" --scenarios short_prompt_crosses_window
       --variants index_copy --modes eager --repeats 1 --backends cpu --faults tf32 --first-catch)
kv_expect_match("${err}" "runs, [0-9]+s elapsed, ETA <= [0-9]+s; now m short_prompt_crosses_window reference/cpu/eager/r0"
                "--first-catch: the ETA is a bound")
kv_expect_match("${err}" "now m short_prompt_crosses_window index_copy\\+tf32/cpu/eager/r0"
                "--first-catch: a fault pass's run named with its fault")
kv_expect_match("${out}" "work: at most the above: each fault's pass stops at its first catch"
                "--first-catch: the work line is a bound")
execute_process(COMMAND h5dump -d /tolerances "${WORK}/g.h5" OUTPUT_VARIABLE dump
                RESULT_VARIABLE rc)
kv_expect_match("${dump}" "the model's calibration, made once on short_prompt_crosses_window"
                "the other unit is judged by the model's calibration")
kv_expect_match("${dump}" "not calibrated: no tolerance decides here"
                "the calibration unit's max_rel_err row says why it has no spread")

# A matrix that would not fit in memory is refused before any work, with its
# estimate, the limit, its largest unit and what to narrow; no report.
set(ENV{KVREPRO_MEMORY_LIMIT} 1048576)
kv_run(2 out err ${KVREPRO} gate --model "${WORK}/m" --scenarios short_prompt_crosses_window,prompt_w
       --variants ring --modes eager --repeats 1 --backends cpu --report "${WORK}/mem.h5")
kv_expect_match("${err}" "needs ~[0-9.]+ GiB of memory at its peak, more than this machine's 0.0 GiB \\(KVREPRO_MEMORY_LIMIT\\): [0-9.]+ GiB of weights, [0-9.]+ GiB for the largest unit and the report \\([^)]*m's [a-z_]+: batch [0-9]+, prompt [0-9]+, [0-9]+ new"
                "a matrix beyond the memory limit refused, naming its largest unit")
kv_expect_match("${err}" "Narrow it with --scenarios" "the refusal says what to narrow")
if(EXISTS "${WORK}/mem.h5")
  message(FATAL_ERROR "a gate refused for memory wrote ${WORK}/mem.h5")
endif()
unset(ENV{KVREPRO_MEMORY_LIMIT})

kv_run(2 out err ${KVREPRO} fixture --family mistral --out "${WORK}/bad" --sliding-window 0)
kv_expect_match("${err}" "--sliding-window: expected at least 1" "window 0 refused")
kv_run(2 out err ${KVREPRO} fixture --family mistral --out "${WORK}/bad" --sliding-window 5000)
kv_expect_match("${err}" "--sliding-window 5000: above 1024" "a window past the positions refused")
if(EXISTS "${WORK}/bad")
  message(FATAL_ERROR "a refused fixture left ${WORK}/bad behind")
endif()
set(ENV{KVREPRO_PROGRESS_EVERY} "soon")
kv_run(2 out err ${KVREPRO} gate --fixture mistral-tiny --report "${WORK}/x.h5")
kv_expect_match("${err}" "KVREPRO_PROGRESS_EVERY: expected seconds in 0..3600, found 'soon'"
                "a bad interval refused")
message(STATUS "real_scale_cli: all checks passed")
