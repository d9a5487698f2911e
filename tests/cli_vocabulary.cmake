# cli_vocabulary.cmake (cmake -P, registered by vocabulary.cmake): every
# alias the kvrepro binary accepts means what its canonical name means, to
# the byte: the same gate typed both ways writes the same report, the same
# fixture the same files. Repeats through an alias are refused like
# repeats of one name.
# -DKVREPRO=... -DWORK=...
include(${CMAKE_CURRENT_LIST_DIR}/cli_helpers.cmake)
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")

function(kv_expect_same_file a b what)
  execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files "${a}" "${b}" RESULT_VARIABLE differ)
  if(differ)
    message(FATAL_ERROR "${what}: ${a} and ${b} differ")
  endif()
endfunction()

# A family is typed as its config.json model_type; the fixtures' short form
# is an alias: the same files either way, model_type as typed canonically.
foreach(family gemma2 gemma3_text gpt_oss mistral qwen2)
  kv_run(0 out err ${KVREPRO} fixture --family ${family} --out "${WORK}/fam_${family}")
  file(READ "${WORK}/fam_${family}/config.json" cfg)
  kv_expect_match("${cfg}" "\"model_type\":[ \t]*\"${family}\"" "fixture --family ${family}")
endforeach()
kv_run(0 out err ${KVREPRO} fixture --family gemma3 --out "${WORK}/fam_gemma3")
foreach(f config.json model.safetensors)
  kv_expect_same_file("${WORK}/fam_gemma3/${f}" "${WORK}/fam_gemma3_text/${f}"
                      "fixture --family gemma3 is --family gemma3_text")
endforeach()
kv_run(2 out err ${KVREPRO} fixture --family gemma3text --out "${WORK}/nope")
kv_expect_match("${err}" "expected gemma2, gemma3_text, gpt_oss, mistral or qwen2 \\(or the short form gemma3\\), found 'gemma3text'"
                "a bad --family names the model_types and the short form")

# The small gates below: one scenario, one repeat, CPU, no calibration.
set(ONE --scenarios prompt_w_plus_1 --repeats 1 --backends cpu --no-calibrate --no-goldens --quiet)

# gate --fixture: a fixture named by its family's model_type is the
# fixture; the report records the fixture's own name.
kv_run(0 out err ${KVREPRO} gate --fixture gemma3-tiny --variants ring ${ONE} --report "${WORK}/g3.h5")
kv_run(0 out err ${KVREPRO} gate --fixture gemma3_text-tiny --variants ring ${ONE} --report "${WORK}/g3t.h5")
kv_expect_same_file("${WORK}/g3.h5" "${WORK}/g3t.h5" "--fixture gemma3_text-tiny is gemma3-tiny")
kv_run(2 out err ${KVREPRO} gate --fixture gemma3_text-huge ${ONE})
kv_expect_match("${err}" "gemma3_text-huge" "an unknown fixture is named as typed")

# gate --variants: the lane's names for the C variants' layouts.
kv_run(0 out err ${KVREPRO} gate --fixture mistral-tiny --variants roll,dynamic ${ONE}
       --report "${WORK}/v_c.h5")
kv_run(0 out err ${KVREPRO} gate --fixture mistral-tiny --variants static_sliding,dynamic_sliding ${ONE}
       --report "${WORK}/v_lane.h5")
kv_expect_same_file("${WORK}/v_c.h5" "${WORK}/v_lane.h5"
                    "--variants static_sliding,dynamic_sliding is roll,dynamic")
kv_run(0 out err ${KVREPRO} gate --fixture mistral-tiny --variants roll,dynamic_sliding_md ${ONE}
       --report "${WORK}/v_md.h5")
kv_expect_same_file("${WORK}/v_c.h5" "${WORK}/v_md.h5" "--variants dynamic_sliding_md is dynamic")
kv_run(2 out err ${KVREPRO} gate --variants roll,static_sliding)
kv_expect_match("${err}" "'roll' given twice \\('static_sliding' is roll\\)" "a variant and its alias")
kv_run(2 out err ${KVREPRO} gate --variants dynamic_sliding,dynamic_sliding_md)
kv_expect_match("${err}" "'dynamic' given twice" "two aliases of one variant")
kv_run(2 out err ${KVREPRO} gate --variants static)
kv_expect_match("${err}" "static_sliding = roll, dynamic_sliding = dynamic, dynamic_sliding_md = dynamic"
                "a bad --variants lists the aliases")

# --plant, and --fault its older name.
kv_run(1 out err ${KVREPRO} gate --fixture mistral-tiny --variants ring ${ONE}
       --plant window_off_by_one --report "${WORK}/plant.h5")
kv_run(1 out err ${KVREPRO} gate --fixture mistral-tiny --variants ring ${ONE}
       --fault window_off_by_one --report "${WORK}/fault.h5")
kv_expect_same_file("${WORK}/plant.h5" "${WORK}/fault.h5" "--fault is --plant")
kv_run(2 out err ${KVREPRO} gate --plant tf32 --fault ring_slot)
kv_expect_match("${err}" "--plant is given twice \\(as --plant and --fault" "--plant and --fault together")
kv_run(2 out err ${KVREPRO} gate --plant tf32 --plant ring_slot)
kv_expect_match("${err}" "option --plant is given twice" "--plant twice")
kv_run(2 out err ${KVREPRO} gate --plant tf32 --faults all)
kv_expect_match("${err}" "--plant and --faults exclude each other" "--plant with --faults")
kv_run(2 out err ${KVREPRO} gate --fault tf32 --faults all)
kv_expect_match("${err}" "--fault and --faults exclude each other" "the older name, as typed")
kv_run(2 out err ${KVREPRO} gate --plant nope)
kv_expect_match("${err}" "--plant 'nope': unknown name 'nope'" "a bad --plant")
kv_run(2 out err ${KVREPRO} gate --model "${WORK}/fam_mistral" --external "${WORK}/plant.h5" --plant tf32)
kv_expect_match("${err}" "--plant cannot be used with --external" "--plant refused with --external")
