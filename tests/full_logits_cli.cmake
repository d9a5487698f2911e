# full_logits_cli.cmake: what a report keeps of the logits above
# --full-logits-max-vocab and in planted-fault passes (registered from
# full_logits.cmake). Every comparison is made on the full rows in memory;
# the report then keeps the full logits of each reference run and of every
# run that failed a tolerance comparison or its finite check, and the top-16
# of the rest. --full-logits-max-vocab 16 makes the tiny fixtures (vocab 512)
# take the large-vocabulary path.
include(${CMAKE_CURRENT_LIST_DIR}/cli_helpers.cmake)
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")

# The shape of one dataset of a report ("" when it is absent).
function(kv_dataset_shape file dataset out_var)
  execute_process(COMMAND h5dump -H -d "${dataset}" "${file}"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_QUIET)
  set(shape "")
  if(rc EQUAL 0 AND out MATCHES "DATASPACE +SIMPLE +\\{ \\( ([0-9, ]+) \\)")
    set(shape "${CMAKE_MATCH_1}")
  endif()
  set(${out_var} "${shape}" PARENT_SCOPE)
endfunction()

function(kv_expect_shape file dataset regex what)
  kv_dataset_shape("${file}" "${dataset}" shape)
  if(NOT shape MATCHES "${regex}")
    message(FATAL_ERROR "${what}: ${dataset} of ${file}: expected shape '${regex}', found '${shape}'")
  endif()
endfunction()

set(common --scenarios prompt_w_plus_1 --variants ring --modes eager --repeats 1 --no-goldens
    --backends cpu)

# (a) A NaN outside every row's top-16 (lm_head row 300: a NaN never ranks in
# a top-k) of a large-vocabulary run: the finite check, made on the full rows
# before anything is cut, fails the reference and names the logit; the report
# keeps the reference's full rows, NaN included.
kv_run(0 out err ${KVREPRO} fixture --family mistral --seed 3 --out "${WORK}/nan")
kv_run(0 out err ${POISON} "${WORK}/nan/model.safetensors" lm_head.weight 38400 nan)
kv_run(1 out err ${KVREPRO} gate --model "${WORK}/nan" ${common} --full-logits-max-vocab 16
       --report "${WORK}/nan.h5")
kv_expect_match("${out}" "FAIL nan prompt_w_plus_1: reference/cpu/eager/r0 finite: [^\n]*nan first at step 0 row 0, probe logits element 300"
                "a NaN outside the top-16 fails the finite check")
kv_expect_shape("${WORK}/nan.h5" /runs/0000/logits "^[0-9]+, 1, 512$"
                "the non-finite reference keeps its full logits")

# (b) A planted fault: the failing run and its reference keep their full
# logits (the calibration members that passed keep the top-16), and diff
# answers with the reference agreement.
kv_run(1 out err ${KVREPRO} gate --fault window_off_by_one --fixture mistral-tiny ${common}
       --report "${WORK}/fault.h5")
kv_run(0 show err ${KVREPRO} show "${WORK}/fault.h5")
kv_expect_match("${show}" "\n4 +mistral-tiny +prompt_w_plus_1 +ring\\+window_off_by_one +cpu +eager +0 +FAIL"
                "run 4 is the failing faulty run")
kv_expect_shape("${WORK}/fault.h5" /runs/0000/logits "^[0-9]+, 1, 512$" "fault pass: the reference")
kv_expect_shape("${WORK}/fault.h5" /runs/0004/logits "^[0-9]+, 1, 512$" "fault pass: the failing run")
kv_expect_shape("${WORK}/fault.h5" /runs/0001/topk_ids "^[0-9]+, 1, 16$"
                "fault pass: a passing calibration member")
kv_run(1 out err ${KVREPRO} diff "${WORK}/fault.h5"
       --run mistral-tiny/prompt_w_plus_1/reference/cpu/eager/r0
       --run mistral-tiny/prompt_w_plus_1/ring+window_off_by_one/cpu/eager/r0)
kv_expect_no_match("${out}" "needs full logits" "diff of a failing fault run")
kv_expect_match("${out}" "reference agreement: token flip above the tie margin at step 0 row 0 [^\n]*\\(max abs [0-9.e+-]+, nmse [0-9.e+-]+, kl [0-9.e+-]+, top-1 [0-9.]+%\\)"
                "diff gives the reference agreement of a failing fault run")

# (c) A clean large-vocabulary gate: the reference keeps its full rows, the
# candidate that passed keeps the top-16 and its row hashes.
kv_run(0 out err ${KVREPRO} gate --quiet --fixture mistral-tiny ${common}
       --full-logits-max-vocab 16 --report "${WORK}/clean.h5")
kv_expect_shape("${WORK}/clean.h5" /runs/0000/logits "^[0-9]+, 1, 512$" "clean: the reference")
kv_expect_shape("${WORK}/clean.h5" /runs/0004/topk_ids "^[0-9]+, 1, 16$" "clean: a passing run")
kv_expect_shape("${WORK}/clean.h5" /runs/0004/logits_hash "^[0-9]+, 1$" "clean: its row hashes")

message(STATUS "full_logits_cli: all checks passed")
