# What the lane keeps, registered from tests/CMakeLists.txt.
#
# gate --external keeps the per-run attributes kvrepro-hf capture records
# (attn_impl, dtype, cache_layer, window, probes_seen, first_recompile:
# docs/SCHEMA.md): a recording with every one of them set is gated and the
# gate's report is read back with libhdf5, attribute by attribute.
kv_add_check(test_external_attrs kvharness test_external_attrs.c tool_run.c)
target_compile_definitions(test_external_attrs PRIVATE KV_SOURCE_DIR="${CMAKE_SOURCE_DIR}"
  KVREPRO="$<TARGET_FILE:kvrepro>")
add_dependencies(test_external_attrs kvrepro)
add_test(NAME external_attrs COMMAND test_external_attrs)
set_tests_properties(external_attrs PROPERTIES LABELS cli)

# The capture's prefill asks for the last position's logits only
# (logits_to_keep, as generate does), on every family of fixtures/hf.
kv_add_python_test(hf_lane_keeps test_lane_keeps hf)
