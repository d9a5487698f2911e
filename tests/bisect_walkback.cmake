# bisect_walkback.cmake: `kvrepro bisect --rerun` does not trust the
# localisation from the recorded hashes. A real gate
# report (reference vs ring with a window off by one, which truly first
# differ at layer0.attn, probe 5 of 31, step 0) is edited by `bisect_craft
# hide` so that run 1's recorded hashes agree with run 0's where the values
# differ, as a probe hash that covers only part of a tensor would:
#   hide_probe.h5: the hashes name final_norm (probe 29) at step 0;
#   hide_step.h5:  step 0 hidden whole, the hashes name final_norm at step 1.
# bisect --rerun must say the hashes' localisation is inconsistent, which
# probe they named and why it moved, name layer0.attn at step 0 as the first
# divergence with its first differing element, exit 1, and write the dumps
# of layer0.attn and its inputs (layer0.q, layer0.cache) to /bisect, with
# the point the hashes named beside it. The unedited report must bisect as
# before, with no walk back. Run by ctest with -DKVREPRO, -DCRAFT and -DWORK.
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")

include(${CMAKE_CURRENT_LIST_DIR}/cli_helpers.cmake)

set(R "${WORK}/R.h5")
kv_run(1 out err ${KVREPRO} gate --quiet --no-goldens --fixture gemma2-tiny --scenarios prompt_w_plus_1
       --variants ring --backends cpu --modes eager --fault window_off_by_one --repeats 1
       --no-calibrate --report "${R}")
kv_run(0 out err ${CRAFT} hide "${R}" "${WORK}")
kv_expect_match("${out}" "first 0 5\n" "the runs truly first differ at step 0, probe 5")

# h5dump's scalar value of attribute ATTR of group GROUP in FILE, into VAR.
function(kv_h5_attr file group attr var)
  execute_process(COMMAND h5dump -a "${group}/${attr}" "${file}" RESULT_VARIABLE rc
                  OUTPUT_VARIABLE dump ERROR_QUIET)
  if(NOT rc EQUAL 0 OR NOT dump MATCHES "\\(0\\): \"?([^\"\n]*)\"?\n")
    message(FATAL_ERROR "${file}: no attribute ${group}/${attr} (h5dump rc ${rc}):\n${dump}")
  endif()
  set(${var} "${CMAKE_MATCH_1}" PARENT_SCOPE)
endfunction()

# kv_check_bisect(FILE STEP PROBE NAME HASH_STEP HASH_PROBE HASH_NAME GROUPS...)
function(kv_check_bisect file step probe name hash_step hash_probe hash_name)
  foreach(pair "step;${step}" "row;0" "probe;${probe}" "probe_name;${name}"
               "hash_step;${hash_step}" "hash_row;0" "hash_probe;${hash_probe}"
               "hash_probe_name;${hash_name}")
    list(GET pair 0 attr)
    list(GET pair 1 want)
    kv_h5_attr("${file}" /bisect ${attr} got)
    if(NOT got STREQUAL want)
      message(FATAL_ERROR "${file}: /bisect ${attr}: expected ${want}, found ${got}")
    endif()
  endforeach()
  execute_process(COMMAND h5dump -n "${file}" OUTPUT_VARIABLE list ERROR_QUIET)
  string(REGEX MATCHALL "group +/bisect/probe_[0-9]+" groups "${list}")
  string(REPLACE "group " "" groups "${groups}")
  string(REGEX REPLACE " +" "" groups "${groups}")
  set(want ${ARGN})
  list(SORT groups)
  list(SORT want)
  if(NOT groups STREQUAL want)
    message(FATAL_ERROR "${file}: /bisect groups: expected ${want}, found ${groups}")
  endif()
  kv_h5_attr("${file}" /bisect/probe_0005 role role)
  if(NOT role STREQUAL "diverged")
    message(FATAL_ERROR "${file}: /bisect/probe_0005 role: expected diverged, found ${role}")
  endif()
endfunction()

set(GROUPS /bisect/probe_0001 /bisect/probe_0004 /bisect/probe_0005)
set(ELEMENT "  diverged  layer0.attn +row 0 element [0-9]+: A -?[0-9.e+-]+, B -?[0-9.e+-]+, ulp [0-9]+; max \\|A-B\\| [0-9.e+-]+\n")

# The hashes name final_norm at step 0; its input layer3.residual already
# differs there, and the earliest difference is layer0.attn.
kv_run(1 out err ${KVREPRO} bisect "${WORK}/hide_probe.h5" --run 0 --run 1 --rerun
       --out "${WORK}/probe_out.h5")
kv_expect_match("${out}" "first divergence: step 0, row 0, probe final_norm \\(probe 29 of 31"
                "hide_probe: the hashes name final_norm")
kv_expect_match("${out}" "localisation inconsistent: the recorded hashes named step 0, row 0, probe final_norm \\(probe 29\\), but the rerun's full values already differ before it: its input layer3.residual differs at step 0; the earliest difference is layer0.attn \\(probe 5\\) at step 0, row 0, earlier in the step's probe order"
                "hide_probe: the walk back says what the hashes named and why it moved")
kv_expect_match("${out}" "why the hashes missed it: the rerun's probe hashes of layer0.attn differ, the recorded ones agree; B's recorded hash there is not the one its rerun computes"
                "hide_probe: why the hashes missed it")
kv_expect_match("${out}" "first divergence \\(rerun values\\): step 0, row 0, layer 0, probe layer0.attn \\(probe 5 of 31; the hashes named final_norm, probe 29 at step 0\\)"
                "hide_probe: layer0.attn is the first divergence")
kv_expect_match("${out}" "${ELEMENT}" "hide_probe: first differing element of layer0.attn")
kv_expect_match("${out}" "  input     layer0.q +identical" "hide_probe: layer0.q agrees")
kv_expect_match("${out}" "  input     layer0.cache +identical" "hide_probe: layer0.cache agrees")
kv_expect_no_match("${out}" "diverged  final_norm" "hide_probe: final_norm not reported as diverged")
kv_check_bisect("${WORK}/probe_out.h5" 0 5 layer0.attn 0 29 final_norm ${GROUPS})

# The hashes name final_norm at step 1; the values already differ at step 0.
kv_run(1 out err ${KVREPRO} bisect "${WORK}/hide_step.h5" --run 0 --run 1 --rerun
       --out "${WORK}/step_out.h5")
kv_expect_match("${out}" "first divergence: step 1, row 0, probe final_norm \\(probe 29 of 31"
                "hide_step: the hashes name final_norm at step 1")
kv_expect_match("${out}" "localisation inconsistent: the recorded hashes named step 1, row 0, probe final_norm \\(probe 29\\), but the rerun's full values already differ before it: [^\n]*the earliest difference is layer0.attn \\(probe 5\\) at step 0, row 0, an earlier step"
                "hide_step: the walk back goes to an earlier step")
kv_expect_match("${out}" "first divergence \\(rerun values\\): step 0, row 0, layer 0, probe layer0.attn \\(probe 5 of 31; the hashes named final_norm, probe 29 at step 1\\)"
                "hide_step: layer0.attn at step 0 is the first divergence")
kv_expect_match("${out}" "rerun to step 0: A reproduces the first rerun's values there, B reproduces\n"
                "hide_step: the rerun to step 0 reproduces the first")
kv_expect_match("${out}" "${ELEMENT}" "hide_step: first differing element of layer0.attn")
kv_check_bisect("${WORK}/step_out.h5" 0 5 layer0.attn 1 29 final_norm ${GROUPS})

# Both files hold the same dumps of layer0.attn at step 0.
foreach(ds a b)
  execute_process(COMMAND h5dump -d /bisect/probe_0005/${ds} "${WORK}/probe_out.h5"
                  OUTPUT_VARIABLE d1 ERROR_QUIET)
  execute_process(COMMAND h5dump -d /bisect/probe_0005/${ds} "${WORK}/step_out.h5"
                  OUTPUT_VARIABLE d2 ERROR_QUIET)
  string(REPLACE "${WORK}/probe_out.h5" "" d1 "${d1}")
  string(REPLACE "${WORK}/step_out.h5" "" d2 "${d2}")
  if(NOT d1 MATCHES "DATA {" OR NOT d1 STREQUAL d2)
    message(FATAL_ERROR "/bisect/probe_0005/${ds}: the two walk backs dumped different values")
  endif()
endforeach()

# The unedited report: the hashes are right, nothing moves.
kv_run(1 out err ${KVREPRO} bisect "${R}" --run 0 --run 1 --rerun --out "${WORK}/ok.h5")
kv_expect_no_match("${out}" "inconsistent|walking back|rerun values" "the unedited report")
kv_expect_match("${out}" "${ELEMENT}" "the unedited report: layer0.attn")
kv_check_bisect("${WORK}/ok.h5" 0 5 layer0.attn 0 5 layer0.attn ${GROUPS})
