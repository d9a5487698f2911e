
# Large vocabularies and planted-fault passes are judged
# on every logit, and their reports keep the full rows of each reference and
# of every run that failed (full_logits_cli.cmake says what each step checks).
add_test(NAME full_logits_cli COMMAND ${CMAKE_COMMAND}
  -DKVREPRO=$<TARGET_FILE:kvrepro> -DPOISON=$<TARGET_FILE:poison_weight>
  -DWORK=${CMAKE_CURRENT_BINARY_DIR}/full_logits_work
  -P ${CMAKE_CURRENT_SOURCE_DIR}/full_logits_cli.cmake)
set_tests_properties(full_logits_cli PROPERTIES LABELS cli)

# A prompts file with texts through the gate,
# show, the failure lines, merge and gate --external; the bad object forms.
add_executable(drop_reference_runs drop_reference_runs.c)
target_compile_options(drop_reference_runs PRIVATE ${KV_C_FLAGS})
target_link_libraries(drop_reference_runs PRIVATE kvreport)
add_test(NAME prompt_texts_cli COMMAND ${CMAKE_COMMAND}
  -DKVREPRO=$<TARGET_FILE:kvrepro> -DDROP_REFS=$<TARGET_FILE:drop_reference_runs>
  -DWORK=${CMAKE_CURRENT_BINARY_DIR}/prompt_texts_work
  -P ${CMAKE_CURRENT_SOURCE_DIR}/prompt_texts_cli.cmake)
set_tests_properties(prompt_texts_cli PROPERTIES LABELS cli)
