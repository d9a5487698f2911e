# Size limits: tests registered here.
# One limits table (reports/kv_limits.h) for the writer, the reader
# and the gate; the prompts file is one JSON value within it. (The report
# reader's budget and shared logits: test_report; an external recording's
# values: test_external.)
kv_add_check(test_bounds kvharness test_bounds.c tool_run.c)
target_compile_definitions(test_bounds PRIVATE KVREPRO="$<TARGET_FILE:kvrepro>")
add_dependencies(test_bounds kvrepro)
add_test(NAME lies_bounds COMMAND test_bounds)
set_tests_properties(lies_bounds PROPERTIES LABELS cli)
