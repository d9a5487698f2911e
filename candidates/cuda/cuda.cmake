# cuda.cmake: the kvcuda library (included from the top CMakeLists.txt).
# CUDA side: device discovery and a self-test kernel (cuda_device), the run
# context (cuda_ctx), the forward and its graph (cuda_forward), the backend
# table (cuda_backend), benchmarks (cuda_bench), kernels (cuda_kernels), the
# six cache variants (cuda_cache), the context shift (cuda_shift), and the
# per-op validation against the CPU reference (cuda_validate*: each launcher
# checked on seeded inputs before anything is timed). Rows at their own
# positions run as single-row runs (engine/backend_rows.h). Without nvcc
# the *_none.c stubs implement the same API as KV_SKIP.
#
# kvcuda does not link kvcore: the products link kvcuda before kvcore or
# kvcore_san, whose symbols (kv_error_set, kv_probe_count, kv_config_*,
# kv_rope_inv_freq, the cache tables, the decode driver) resolve at the final
# link.
if(KV_HAVE_CUDA)
  find_package(CUDAToolkit REQUIRED)
  add_library(kvcuda STATIC candidates/cuda/cuda_device.cu candidates/cuda/cuda_ctx.cu
    candidates/cuda/cuda_forward.cu candidates/cuda/cuda_backend.cu candidates/cuda/cuda_bench.cu
    candidates/cuda/cuda_kernels.cu candidates/cuda/cuda_cache.cu candidates/cuda/cuda_shift.cu
    candidates/cuda/cuda_validate.cu candidates/cuda/cuda_validate_ops.cu
    candidates/cuda/cuda_validate_attn.cu)
  target_include_directories(kvcuda PUBLIC candidates/cuda candidates engine reference model)
  # --fmad=false is nvcc's -ffp-contract=off; fast math is never enabled
  # (so -prec-div, -prec-sqrt and -ftz=false keep their IEEE defaults).
  # -Xcompiler=-Wall,-Wextra: the host half of the .cu files gets the same
  # warnings as the C code (the build is expected to print none; errors
  # with KV_WERROR, as in CI).
  set(KV_CUDA_WERROR "")
  if(KV_WERROR)
    set(KV_CUDA_WERROR -Werror=all-warnings)
  endif()
  target_compile_options(kvcuda PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--fmad=false ${KV_CUDA_WERROR} -Xcompiler=-Wall,-Wextra,${KV_PREFIX_MAP}>)
  # cuBLAS: the static library when the toolkit has one (the GPU bundle then
  # needs only the driver), else the shared one. Static cuBLAS is C++ inside
  # and the products link with the C linker, hence libstdc++ (that branch is
  # untested: the toolkit this was written with ships only libcublas.so).
  if(TARGET CUDA::cublas_static)
    set(KV_CUBLAS CUDA::cublas_static stdc++)
  else()
    set(KV_CUBLAS CUDA::cublas)
  endif()
  message(STATUS "kvrepro: kvcuda links ${KV_CUBLAS} and CUDA::cudart_static")
  target_link_libraries(kvcuda PUBLIC ${KV_CUBLAS} CUDA::cudart_static)
  string(REPLACE ";" "," KV_CUDA_ARCHS_TEXT "${CMAKE_CUDA_ARCHITECTURES}")
  target_compile_definitions(kvcuda PRIVATE KV_CUDA_ARCHS="${KV_CUDA_ARCHS_TEXT}")
else()
  add_library(kvcuda STATIC candidates/cuda/cuda_device_none.c candidates/cuda/cuda_forward_none.c
    candidates/cuda/cuda_validate_none.c)
  target_include_directories(kvcuda PUBLIC candidates/cuda candidates engine reference model)
  target_compile_options(kvcuda PRIVATE ${KV_C_FLAGS})
endif()
target_compile_definitions(kvcuda PUBLIC KV_HAVE_CUDA=${KV_HAVE_CUDA})

# bench_cuda: GPU decode latency, eager vs graph per variant, against the
# kernel-time and bandwidth floors. Not a test (ctest does not run it).
add_executable(bench_cuda bench/bench_cuda.c)
target_compile_options(bench_cuda PRIVATE ${KV_C_FLAGS})
target_compile_definitions(bench_cuda PRIVATE _POSIX_C_SOURCE=200809L)
target_include_directories(bench_cuda PRIVATE fixtures)
target_link_libraries(bench_cuda PRIVATE kvcuda kvcore)
set_target_properties(bench_cuda PROPERTIES LINKER_LANGUAGE C)
