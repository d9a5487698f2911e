# issue 32 (writes): tests registered here.

# Tools: writes_craft makes the crafted inputs of lies_writes_cli.cmake.
add_executable(writes_craft writes_craft.c)
target_compile_options(writes_craft PRIVATE ${KV_C_FLAGS})
target_compile_definitions(writes_craft PRIVATE _POSIX_C_SOURCE=200809L)
target_link_libraries(writes_craft PRIVATE kvreport)

# End to end (item 4 and item 7's merge labels, damaged /bisect, fixture
# directory): both builds.
add_test(NAME cli_lies_writes COMMAND ${CMAKE_COMMAND}
  -DKVREPRO=$<TARGET_FILE:kvrepro> -DCRAFT=$<TARGET_FILE:writes_craft>
  -DWORK=${CMAKE_CURRENT_BINARY_DIR}/lies_writes_work
  -P ${CMAKE_CURRENT_SOURCE_DIR}/lies_writes_cli.cmake)
set_tests_properties(cli_lies_writes PROPERTIES LABELS cli)
add_test(NAME cli_lies_writes_sanitized COMMAND ${CMAKE_COMMAND}
  -DKVREPRO=$<TARGET_FILE:kvrepro_san> -DCRAFT=$<TARGET_FILE:writes_craft>
  -DWORK=${CMAKE_CURRENT_BINARY_DIR}/lies_writes_work_san
  -P ${CMAKE_CURRENT_SOURCE_DIR}/lies_writes_cli.cmake)
set_tests_properties(cli_lies_writes_sanitized PROPERTIES LABELS "cli;sanitize"
  ENVIRONMENT "ASAN_OPTIONS=detect_leaks=1:abort_on_error=1;UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")
