# One vocabulary across surfaces (docs/cli.md, "Names"): every alias the
# kvrepro binary and kvrepro-hf accept, each shown to mean exactly what its
# canonical name means; and the lane's and the C gate's names for the same
# layouts checked against each other.
add_test(NAME cli_vocabulary COMMAND ${CMAKE_COMMAND}
  -DKVREPRO=$<TARGET_FILE:kvrepro> -DWORK=${CMAKE_CURRENT_BINARY_DIR}/vocabulary_work
  -P ${CMAKE_CURRENT_SOURCE_DIR}/cli_vocabulary.cmake)
set_tests_properties(cli_vocabulary PROPERTIES LABELS cli)
# kvrepro-hf capture --cache's aliases and its one line for `ring`, and the
# lane's layer names against `kvrepro gate`'s (python.cmake's helper).
kv_add_python_test(hf_names test_names)
