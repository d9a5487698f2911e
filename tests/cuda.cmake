# cuda.cmake: CUDA tests (included from tests/CMakeLists.txt).
kv_add_check(test_cuda_device kvcore test_cuda_device.c no_device.c)
target_link_libraries(test_cuda_device PRIVATE kvcuda kvcore)
set_target_properties(test_cuda_device PROPERTIES LINKER_LANGUAGE C)
# The no-device path always runs (the child hides devices with
# CUDA_VISIBLE_DEVICES=""), so it shows as Passed; the device part exits 77
# (Skipped, with the CUDA error text) when there is no GPU.
add_test(NAME cuda_no_device COMMAND test_cuda_device --no-device-only)
set_tests_properties(cuda_no_device PROPERTIES LABELS cuda)
add_test(NAME cuda_device COMMAND test_cuda_device --device-only)
set_tests_properties(cuda_device PROPERTIES LABELS cuda SKIP_RETURN_CODE 77)

# The CUDA forward, its six variants, graph mode and in-graph probes
# (candidates/cuda_forward.h). kvcuda links first and kvcore after it, as the
# products do: kvcuda's references to kvcore resolve at this final link.
# compare.h (header only) gives the gate's tolerances for GPU vs CPU.
kv_add_check(test_cuda_forward kvcuda test_cuda_forward.c no_device.c)
target_link_libraries(test_cuda_forward PRIVATE kvharness kvcore)
target_include_directories(test_cuda_forward PRIVATE ${CMAKE_SOURCE_DIR}/harness
  ${CMAKE_SOURCE_DIR}/reports)
set_target_properties(test_cuda_forward PROPERTIES LINKER_LANGUAGE C)
# As cuda_no_device / cuda_device: the no-device child always runs (Passed);
# the device suite exits 77 (Skipped, with the CUDA error text) without a GPU.
add_test(NAME cuda_forward_no_device COMMAND test_cuda_forward --no-device-only)
set_tests_properties(cuda_forward_no_device PROPERTIES LABELS cuda)
add_test(NAME cuda_forward_device COMMAND test_cuda_forward --device-only)
set_tests_properties(cuda_forward_device PROPERTIES LABELS cuda SKIP_RETURN_CODE 77)

# Per-op validation (candidates/cuda/cuda_validate.h): every launcher against
# its CPU op, bitwise or within a derived bound, guarded buffers, planted
# faults caught. As cuda_forward_*: the no-device child always runs
# (Passed); the device suite exits 77 (Skipped, with the CUDA error text)
# without a GPU.
kv_add_check(test_cuda_ops kvcuda test_cuda_ops.c no_device.c)
target_link_libraries(test_cuda_ops PRIVATE kvcore)
set_target_properties(test_cuda_ops PROPERTIES LINKER_LANGUAGE C)
add_test(NAME cuda_ops_no_device COMMAND test_cuda_ops --no-device-only)
set_tests_properties(cuda_ops_no_device PROPERTIES LABELS cuda)
add_test(NAME cuda_ops_device COMMAND test_cuda_ops --device-only)
set_tests_properties(cuda_ops_device PROPERTIES LABELS cuda SKIP_RETURN_CODE 77)
