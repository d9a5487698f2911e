# cuda.cmake: CUDA tests (included from tests/CMakeLists.txt).
kv_add_check(test_cuda_device kvcore test_cuda_device.c)
target_link_libraries(test_cuda_device PRIVATE kvcuda)
set_target_properties(test_cuda_device PROPERTIES LINKER_LANGUAGE C)
# The no-device path always runs (the child hides devices with
# CUDA_VISIBLE_DEVICES=""), so it shows as Passed; the device part exits 77
# (Skipped, with the CUDA error text) when there is no GPU.
add_test(NAME cuda_no_device COMMAND test_cuda_device --no-device-only)
set_tests_properties(cuda_no_device PROPERTIES LABELS cuda)
add_test(NAME cuda_device COMMAND test_cuda_device --device-only)
set_tests_properties(cuda_device PROPERTIES LABELS cuda SKIP_RETURN_CODE 77)

