# GPU backends: STRATA_CUDA (nvcc) or STRATA_HIP (hipcc, the same .cu sources
# through src/backend/cuda/compat.h). Both are off by default, so the CPU
# build needs no GPU toolkit at all.
#
# What this file sets for src/CMakeLists.txt and src/backend/cuda/:
#   STRATA_GPU          ON when either backend is built
#   STRATA_GPU_LANG     CUDA or HIP (the language the .cu files compile as)
#   STRATA_GPU_LIBS     libraries the aggregated strata libraries must link
#   STRATA_GPU_ARCHS    the architecture list, baked into the binary so that a
#                       card the build has no code for is refused at start
# and the compile definition STRATA_HAVE_GPU everywhere (engine and CLI pick
# the backend at run time; only their start-up code looks at it).
option(STRATA_CUDA "Build the CUDA backend (needs nvcc, cudart, cuBLAS)" OFF)
option(STRATA_HIP "Build the GPU backend for AMD GPUs with HIP (needs hipcc, hipBLAS)" OFF)

set(STRATA_GPU OFF)
if(STRATA_CUDA AND STRATA_HIP)
  message(FATAL_ERROR "STRATA_CUDA and STRATA_HIP are exclusive: build one GPU backend per build directory")
endif()

if(STRATA_CUDA)
  # Hopper (H100/H200) and Ampere consumer cards by default; override with
  # -DCMAKE_CUDA_ARCHITECTURES="89;120" etc. Must be set before enable_language.
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR CMAKE_CUDA_ARCHITECTURES STREQUAL "")
    set(CMAKE_CUDA_ARCHITECTURES "90;86" CACHE STRING "CUDA architectures to build code for" FORCE)
  endif()
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  set(STRATA_GPU ON)
  set(STRATA_GPU_LANG CUDA)
  set(STRATA_GPU_LIBS CUDA::cudart CUDA::cublas CUDA::cublasLt)
  set(STRATA_GPU_ARCHS ${CMAKE_CUDA_ARCHITECTURES})
elseif(STRATA_HIP)
  if(NOT DEFINED CMAKE_HIP_ARCHITECTURES OR CMAKE_HIP_ARCHITECTURES STREQUAL "")
    # RDNA2/RDNA3: wave32 cards. Wave64 targets (gfx9xx, CDNA) are refused at
    # start by the backend (the kernels assume 32-lane warps).
    set(CMAKE_HIP_ARCHITECTURES "gfx1100;gfx1030" CACHE STRING "HIP architectures to build code for" FORCE)
  endif()
  enable_language(HIP)
  find_package(hip REQUIRED)
  find_package(hipblas REQUIRED)
  set(STRATA_GPU ON)
  set(STRATA_GPU_LANG HIP)
  set(STRATA_GPU_LIBS hip::host roc::hipblas)
  set(STRATA_GPU_ARCHS ${CMAKE_HIP_ARCHITECTURES})
endif()

if(STRATA_GPU)
  # "90;86" -> "90,86": a string the device code compares each card against.
  string(REPLACE ";" "," STRATA_GPU_ARCHS_STR "${STRATA_GPU_ARCHS}")
  add_compile_definitions(STRATA_HAVE_GPU=1)
  message(STATUS "Strata GPU backend: ${STRATA_GPU_LANG}, architectures ${STRATA_GPU_ARCHS_STR}")
endif()
