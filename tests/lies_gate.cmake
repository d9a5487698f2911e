# The gate's verdict: tests registered here.
# Nothing judged is a failure (empty shard, every run skipped);
# --report/--junit never name one file or an input.
add_test(NAME lies_gate_judged COMMAND ${CMAKE_COMMAND}
  -DKVREPRO=$<TARGET_FILE:kvrepro> -DWORK=${CMAKE_CURRENT_BINARY_DIR}/lies_gate_judged
  -DSOURCE_DIR=${CMAKE_SOURCE_DIR}
  -P ${CMAKE_CURRENT_SOURCE_DIR}/lies_gate_cli.cmake)
set_tests_properties(lies_gate_judged PROPERTIES LABELS cli)
# The reference judged against transformers' goldens: an edited
# golden (a moved logit, a flipped token) fails `golden`; a missing one is
# exit 2 unless --no-goldens.
kv_add_check(test_gate_golden kvreport test_gate_golden.c tool_run.c)
target_include_directories(test_gate_golden PRIVATE ${HDF5_INCLUDE_DIRS})
target_compile_definitions(test_gate_golden PRIVATE KV_SOURCE_DIR="${CMAKE_SOURCE_DIR}"
  KVREPRO="$<TARGET_FILE:kvrepro>")
add_dependencies(test_gate_golden kvrepro)
add_test(NAME lies_gate_golden COMMAND test_gate_golden)
set_tests_properties(lies_gate_golden PROPERTIES LABELS cli)
