# MPI for a layer split across processes and hosts (src/engine/split.h,
# docs/multi.md): STRATA_MPI is ON when an MPI for C is found (Debian's
# libopenmpi-dev), OFF otherwise; asked for and missing, it is an error.
# What this file sets for src/:
#   STRATA_MPI_LIBS     the library the aggregated strata libraries link
# and the compile definition STRATA_HAVE_MPI everywhere (only split.c's
# start-up looks at it); src/engine/split_mpi.c is compiled only then.
find_package(MPI COMPONENTS C QUIET)
option(STRATA_MPI "Build the layer split across MPI ranks (needs an MPI for C, e.g. libopenmpi-dev)" ${MPI_C_FOUND})
set(STRATA_MPI_LIBS "")
if(STRATA_MPI)
  if(NOT MPI_C_FOUND)
    message(FATAL_ERROR "STRATA_MPI is ON but no MPI for C was found: install libopenmpi-dev (scripts/install-deps.sh)")
  endif()
  add_compile_definitions(STRATA_HAVE_MPI)
  set(STRATA_MPI_LIBS MPI::MPI_C)
  find_program(STRATA_MPIEXEC NAMES mpirun mpiexec)
  message(STATUS "MPI layer split: on (${MPI_C_LIBRARIES}; tests launch ${STRATA_MPIEXEC})")
else()
  message(STATUS "MPI layer split: off")
endif()
