# Model loading: tests registered here.

# config_dump: prints the configuration kv_config_load resolves (every default
# applied) as JSON, for hf_config_defaults to compare with transformers'
# config classes.
add_executable(config_dump config_dump.c)
target_compile_options(config_dump PRIVATE ${KV_C_FLAGS})
target_compile_definitions(config_dump PRIVATE _POSIX_C_SOURCE=200809L)
target_link_libraries(config_dump PRIVATE kvcore)

# Every optional config.json field takes transformers' default for its family:
# a minimal config.json per family read by both sides.
kv_add_python_test(hf_config_defaults test_config_defaults hf)
set_property(TEST hf_config_defaults APPEND PROPERTY ENVIRONMENT
  "KVREPRO_CONFIG_DUMP=$<TARGET_FILE:config_dump>")
