# Names listed once: every list of names a user sees (help texts,
# "expected ..." messages) holds every name of its registry, as
# names_listed.c reads them; help texts fit 80 columns and name only paths
# that exist in the source tree.
add_executable(names_listed names_listed.c)
target_compile_options(names_listed PRIVATE ${KV_C_FLAGS})
target_compile_definitions(names_listed PRIVATE _POSIX_C_SOURCE=200809L)
target_link_libraries(names_listed PRIVATE kvharness)
add_test(NAME cli_names_listed COMMAND ${CMAKE_COMMAND}
  -DKVREPRO=$<TARGET_FILE:kvrepro> -DNAMES=$<TARGET_FILE:names_listed>
  -DSOURCE_DIR=${CMAKE_SOURCE_DIR} -DWORK=${CMAKE_CURRENT_BINARY_DIR}/names_listed_work
  -P ${CMAKE_CURRENT_SOURCE_DIR}/names_listed_check.cmake)
set_tests_properties(cli_names_listed PROPERTIES LABELS cli)
