# issue 32 (gate): tests registered here.
# Items 1 and 4: nothing judged is a failure (empty shard, every run skipped);
# --report/--junit never name one file or an input.
add_test(NAME lies_gate_judged COMMAND ${CMAKE_COMMAND}
  -DKVREPRO=$<TARGET_FILE:kvrepro> -DWORK=${CMAKE_CURRENT_BINARY_DIR}/lies_gate_judged
  -DSOURCE_DIR=${CMAKE_SOURCE_DIR}
  -P ${CMAKE_CURRENT_SOURCE_DIR}/lies_gate_cli.cmake)
set_tests_properties(lies_gate_judged PROPERTIES LABELS cli)
