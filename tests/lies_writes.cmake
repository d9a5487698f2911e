# Output writes: tests registered here.

# Tools: writes_craft makes the crafted inputs of lies_writes_cli.cmake.
add_executable(writes_craft writes_craft.c)
target_compile_options(writes_craft PRIVATE ${KV_C_FLAGS})
target_compile_definitions(writes_craft PRIVATE _POSIX_C_SOURCE=200809L)
target_link_libraries(writes_craft PRIVATE kvreport)

# End to end (bisect --rerun --out, merge's shard labels, damaged /bisect, fixture
# directory). Not yet against kvrepro_san: libhdf5 1.10 does not free what
# a failed read of the damaged header allocated, which LeakSanitizer would
# report (tests/fuzz known-open F5); unverified there.
add_test(NAME cli_lies_writes COMMAND ${CMAKE_COMMAND}
  -DKVREPRO=$<TARGET_FILE:kvrepro> -DCRAFT=$<TARGET_FILE:writes_craft>
  -DWORK=${CMAKE_CURRENT_BINARY_DIR}/lies_writes_work
  -P ${CMAKE_CURRENT_SOURCE_DIR}/lies_writes_cli.cmake)
set_tests_properties(cli_lies_writes PROPERTIES LABELS cli)
