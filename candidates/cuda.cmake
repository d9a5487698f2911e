# cuda.cmake: the kvcuda library (included from the top CMakeLists.txt).
# CUDA side: device discovery and a self-test kernel (the CUDA forward and
# variants land in candidates/ on top of this).
if(KV_HAVE_CUDA)
  find_package(CUDAToolkit REQUIRED)
  add_library(kvcuda STATIC candidates/cuda_device.cu)
  target_include_directories(kvcuda PUBLIC candidates reference)
  # --fmad=false is nvcc's -ffp-contract=off; fast math is never enabled.
  target_compile_options(kvcuda PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--fmad=false -Werror=all-warnings>)
  target_link_libraries(kvcuda PUBLIC CUDA::cudart_static)
  string(REPLACE ";" "," KV_CUDA_ARCHS_TEXT "${CMAKE_CUDA_ARCHITECTURES}")
  target_compile_definitions(kvcuda PRIVATE KV_CUDA_ARCHS="${KV_CUDA_ARCHS_TEXT}")
else()
  add_library(kvcuda STATIC candidates/cuda_device_none.c)
  target_include_directories(kvcuda PUBLIC candidates reference)
  target_compile_options(kvcuda PRIVATE ${KV_C_FLAGS})
endif()
target_compile_definitions(kvcuda PUBLIC KV_HAVE_CUDA=${KV_HAVE_CUDA})
