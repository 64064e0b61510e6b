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
option(STRATA_HIP "Build the GPU backend for AMD GPUs with HIP (needs hipcc; hipBLAS optional)" OFF)

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
    # RDNA2 by default; any list of gfx906, gfx1030..gfx1036, gfx1100,
    # gfx1101, gfx1151, gfx1200, gfx1201 builds with Debian's packages
    # (docs/amd.md; scripts/check-hip.sh compiles all eight that CI checks).
    set(CMAKE_HIP_ARCHITECTURES "gfx1030" CACHE STRING "HIP architectures to build code for" FORCE)
  endif()
  # CMake's HIP language wants a clang, not the hipcc wrapper: Debian's
  # clang-19 (package clang-19, with lld-19) compiles for gfx11 and gfx12,
  # which ROCm 5.2's clang-15 does not know; clang-15 is the fallback.
  if(NOT DEFINED CMAKE_HIP_COMPILER AND NOT DEFINED ENV{HIPCXX})
    find_program(STRATA_HIP_CLANG NAMES clang++ PATHS /opt/rocm/llvm/bin /usr/lib/llvm-19/bin /usr/lib/llvm-15/bin
                 NO_DEFAULT_PATH)
    if(STRATA_HIP_CLANG)
      set(CMAKE_HIP_COMPILER ${STRATA_HIP_CLANG})
    endif()
  endif()
  # CMake (before 3.28) looks for ROOT/lib/cmake/hip-lang only; Debian keeps
  # it under lib/<multiarch>/. A root in the build tree whose lib/cmake
  # links to Debian's folder satisfies it: the package resolves its real
  # path and finds /usr as its prefix.
  if(NOT DEFINED CMAKE_HIP_COMPILER_ROCM_ROOT AND NOT EXISTS /usr/lib/cmake/hip-lang/hip-lang-config.cmake
     AND NOT EXISTS /opt/rocm/lib/cmake/hip-lang/hip-lang-config.cmake)
    file(GLOB STRATA_HIP_LANG_DIRS /usr/lib/*/cmake/hip-lang)
    if(STRATA_HIP_LANG_DIRS)
      list(GET STRATA_HIP_LANG_DIRS 0 STRATA_HIP_LANG_DIR)
      set(STRATA_HIP_ROOT ${CMAKE_BINARY_DIR}/hip-root)
      file(MAKE_DIRECTORY ${STRATA_HIP_ROOT}/lib/cmake ${STRATA_HIP_ROOT}/bin)
      file(CREATE_LINK ${STRATA_HIP_LANG_DIR} ${STRATA_HIP_ROOT}/lib/cmake/hip-lang SYMBOLIC)
      set(CMAKE_HIP_COMPILER_ROCM_ROOT ${STRATA_HIP_ROOT})
      # The compiler checks run in projects of their own, which do not know
      # the multiarch folder yet: give them its cmake/ as a prefix (each
      # package sits in <prefix>/<name>/), e.g. for amd_comgr.
      get_filename_component(STRATA_HIP_CMAKE_DIR ${STRATA_HIP_LANG_DIR} DIRECTORY)
      set(ENV{CMAKE_PREFIX_PATH} "${STRATA_HIP_CMAKE_DIR}:$ENV{CMAKE_PREFIX_PATH}")
      # Debian's plain clang does not find the HIP headers and device
      # bitcode by itself (hipcc passes the same two options). The bitcode
      # folder is a build-local one: links to Debian's ROCm 5.2 libraries
      # plus the oclc_isa_version_<N>.bc they lack for newer targets
      # (scripts/hip-device-libs.sh; needs llvm-19's llvm-as).
      file(GLOB STRATA_HIP_BITCODE /usr/lib/*/amdgcn/bitcode)
      if(STRATA_HIP_BITCODE)
        list(GET STRATA_HIP_BITCODE 0 STRATA_HIP_BITCODE)
        execute_process(COMMAND ${CMAKE_SOURCE_DIR}/scripts/hip-device-libs.sh ${CMAKE_BINARY_DIR}/hip-devlib
                                ${CMAKE_HIP_ARCHITECTURES}
                        RESULT_VARIABLE STRATA_HIP_DEVLIB_RC OUTPUT_QUIET)
        if(STRATA_HIP_DEVLIB_RC EQUAL 0)
          set(STRATA_HIP_BITCODE ${CMAKE_BINARY_DIR}/hip-devlib)
        else()
          message(WARNING "Strata HIP: scripts/hip-device-libs.sh failed; using ${STRATA_HIP_BITCODE} as it is")
        endif()
        set(CMAKE_HIP_FLAGS "${CMAKE_HIP_FLAGS} --rocm-path=/usr --hip-device-lib-path=${STRATA_HIP_BITCODE}")
      endif()
    endif()
  endif()
  # hip-lang's targets add -isystem /usr/include (Debian's prefix), which
  # puts it before the C++ headers' #include_next <math.h> under clang-19;
  # as an implicit directory CMake leaves it out (it is searched anyway).
  if(NOT DEFINED CMAKE_HIP_IMPLICIT_INCLUDE_DIRECTORIES)
    set(CMAKE_HIP_IMPLICIT_INCLUDE_DIRECTORIES /usr/include)
  endif()
  enable_language(HIP)
  set(CMAKE_HIP_STANDARD 17) # the kernels use if constexpr
  set(CMAKE_HIP_STANDARD_REQUIRED ON)
  # hip-config.cmake (ROCm 5.x) reads CMAKE_CXX_COMPILER_ID: it needs C++ on.
  enable_language(CXX)
  # Debian's hip-config.cmake refuses to load without /usr/bin/hipcc (package
  # hipcc, which brings clang-15); a build with clang-19 needs only what
  # hip::host gives C code: the runtime library and the platform macro.
  find_program(STRATA_HIPCC hipcc PATHS /opt/rocm/bin)
  if(STRATA_HIPCC)
    find_package(hip REQUIRED)
  else()
    find_library(STRATA_AMDHIP64 amdhip64 REQUIRED)
    add_library(strata_hip_host INTERFACE)
    target_link_libraries(strata_hip_host INTERFACE ${STRATA_AMDHIP64})
    target_compile_definitions(strata_hip_host INTERFACE __HIP_PLATFORM_AMD__=1)
    add_library(hip::host ALIAS strata_hip_host)
  endif()
  # hipBLAS is optional: Debian bookworm packages neither hipBLAS nor
  # rocBLAS. Without it the GEMM path is compiled out (compat.h) and every
  # product runs on the matrix-vector kernels.
  find_package(hipblas QUIET)
  set(STRATA_GPU ON)
  set(STRATA_GPU_LANG HIP)
  if(hipblas_FOUND)
    set(STRATA_HIP_BLAS 1)
    set(STRATA_GPU_LIBS hip::host roc::hipblas)
  else()
    set(STRATA_HIP_BLAS 0)
    set(STRATA_GPU_LIBS hip::host)
    message(STATUS "Strata HIP: hipBLAS not found, prompt products use the matrix-vector kernels")
  endif()
  set(STRATA_GPU_ARCHS ${CMAKE_HIP_ARCHITECTURES})
endif()

if(STRATA_GPU)
  # "90;86" -> "90,86": a string the device code compares each card against.
  string(REPLACE ";" "," STRATA_GPU_ARCHS_STR "${STRATA_GPU_ARCHS}")
  add_compile_definitions(STRATA_HAVE_GPU=1)
  if(STRATA_HIP)
    # Everywhere, not only in the backend: C code that includes
    # backend/cuda/compat.h (tests) must see HIP's runtime, not CUDA's.
    add_compile_definitions(STRATA_HIP=1)
  endif()
  message(STATUS "Strata GPU backend: ${STRATA_GPU_LANG}, architectures ${STRATA_GPU_ARCHS_STR}")
endif()
