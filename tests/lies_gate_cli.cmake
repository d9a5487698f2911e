# lies_gate_cli.cmake: a gate that judged nothing, or less than it planned,
# does not pass. Run by ctest (lies_gate.cmake) with
# -DKVREPRO=<binary> -DWORK=<scratch dir>.
include(${CMAKE_CURRENT_LIST_DIR}/cli_helpers.cmake)
# kv_run_any(RC_VAR OUT_VAR ERR_VAR args...): any exit code.
function(kv_run_any rc_var out_var err_var)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  set(${rc_var} "${rc}" PARENT_SCOPE)
  set(${out_var} "${out}" PARENT_SCOPE)
  set(${err_var} "${err}" PARENT_SCOPE)
endfunction()
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
set(one_unit --fixture mistral-tiny --scenarios prompt_w --repeats 1 --max-new-tokens 4
    --no-calibrate)

# A shard that holds no unit judged nothing: exit 1, saying so, and its
# JUnit says so too (one failed test case, not an empty green file) ...
kv_run(1 out err ${KVREPRO} gate ${one_unit} --no-goldens --shard 2/2 --junit ${WORK}/empty.xml)
kv_expect_match("${out}" "FAIL: this shard \\(2/2\\) holds none of the gate's 1 \\(model, scenario\\) units"
  "empty shard")
file(READ ${WORK}/empty.xml junit)
kv_expect_match("${junit}" "<testsuites name=\"kvrepro\" tests=\"1\" failures=\"1\"" "empty shard junit totals")
kv_expect_match("${junit}" "<failure message=\"this shard \\(2/2\\) holds none" "empty shard junit failure")
kv_expect_match("${out}" "--allow-empty" "empty shard names the way out")
# ... and passes only with --allow-empty, which the last line says.
kv_run(0 out err ${KVREPRO} gate ${one_unit} --no-goldens --shard 2/2 --allow-empty)
kv_expect_match("${out}" "empty shard 2/2: no unit to judge \\(accepted: --allow-empty\\)\n$"
  "allowed empty shard")

# Every candidate run skipped with a reason (cuda on a machine without a
# GPU): nothing was judged, the gate fails. Where a GPU runs them the
# premise does not hold and this case is skipped, saying so.
kv_run_any(rc out err ${KVREPRO} gate ${one_unit} --no-goldens --backends cuda)
if(out MATCHES "cuda: skipped, no device")
  if(NOT rc EQUAL 1)
    message(FATAL_ERROR "cuda-only gate without a device: expected exit 1, got ${rc}\n${out}${err}")
  endif()
  kv_expect_match("${out}" "FAIL: the gate judged no candidate run: every one was skipped \\(" "all skipped")
  kv_run_any(rc out err ${KVREPRO} gate ${one_unit} --no-goldens --backends cuda --junit ${WORK}/skipped.xml)
  file(READ ${WORK}/skipped.xml junit)
  kv_expect_match("${junit}" "failures=\"1\"" "all-skipped junit counts the gate's failure")
  kv_expect_match("${junit}" "name=\"gate: judged enough\"" "all-skipped junit names the gate's case")
else()
  message(STATUS "skipped: the cuda-only case needs a machine where cuda runs are skipped")
endif()

# A unit that ran judges: the same gate on one shard of one passes, and says
# nothing about emptiness.
kv_run(0 out err ${KVREPRO} gate ${one_unit} --no-goldens --backends cpu)
kv_expect_no_match("${out}" "FAIL|empty shard" "one unit judged")

# --report/--junit never name one file, nor a file the gate reads:
# exit 2 before any work, the input untouched.
set(prompts ${WORK}/prompts.json)
file(WRITE ${prompts} "[[5,17,42]]\n")
kv_run(2 out err ${KVREPRO} gate --fixture mistral-tiny --prompts ${prompts} --max-new-tokens 2
  --report ${prompts})
kv_expect_match("${err}" "--report .*prompts.json is .*prompts.json, an input of this gate" "report over prompts")
file(READ ${prompts} kept)
if(NOT kept STREQUAL "[[5,17,42]]\n")
  message(FATAL_ERROR "the prompts file was changed: ${kept}")
endif()
kv_run(2 out err ${KVREPRO} gate ${one_unit} --report ${WORK}/same.h5 --junit ${WORK}/./same.h5)
kv_expect_match("${err}" "name the same file" "report and junit one file")
if(EXISTS ${WORK}/same.h5)
  message(FATAL_ERROR "same.h5 was written")
endif()
file(COPY ${SOURCE_DIR}/fixtures/hf/mistral DESTINATION ${WORK})
file(SHA256 ${WORK}/mistral/config.json cfg_hash)
kv_run(2 out err ${KVREPRO} gate --model ${WORK}/mistral --junit ${WORK}/mistral/config.json)
kv_expect_match("${err}" "a file of the checkpoint this gate reads" "junit over config.json")
file(CREATE_LINK ${WORK}/mistral/model.safetensors ${WORK}/link.h5 SYMBOLIC)
kv_run(2 out err ${KVREPRO} gate --model ${WORK}/mistral --report ${WORK}/link.h5)
kv_expect_match("${err}" "model.safetensors, a file of the checkpoint" "report through a link")
kv_run(2 out err ${KVREPRO} gate --model ${WORK}/mistral --external ${prompts} --report ${prompts})
kv_expect_match("${err}" "an input of this gate" "external report over its input")
file(SHA256 ${WORK}/mistral/config.json cfg_after)
if(NOT cfg_hash STREQUAL cfg_after)
  message(FATAL_ERROR "config.json was changed")
endif()

# An option's value that looks like an option, a repeated option,
# an empty or repeated fault name: exit 2, nothing written.
kv_run(2 out err ${KVREPRO} gate ${one_unit} --report --quiet)
kv_expect_match("${err}" "option --report needs a value, found the option '--quiet'" "value that is an option")
if(EXISTS ${WORK}/--quiet OR EXISTS --quiet)
  message(FATAL_ERROR "a file named --quiet was written")
endif()
kv_run(2 out err ${KVREPRO} gate ${one_unit} --repeats 2)
kv_expect_match("${err}" "option --repeats is given twice" "repeated option")
kv_run(2 out err ${KVREPRO} gate ${one_unit} --shard 1/2 --shard=2/2)
kv_expect_match("${err}" "option --shard is given twice" "repeated option, = form")
kv_run(2 out err ${KVREPRO} gate ${one_unit} --fault ring_slot,,ring_slot)
kv_expect_match("${err}" "an empty name" "empty fault name")
kv_run(2 out err ${KVREPRO} gate ${one_unit} --fault ring_slot,ring_slot)
kv_expect_match("${err}" "'ring_slot' given twice" "repeated fault name")
# what may be repeated still is
kv_run(0 out err ${KVREPRO} gate ${one_unit} --no-goldens --backends cpu --variants ring --tol tie_margin=0.001
  --tol max_rel_err=0.001)
