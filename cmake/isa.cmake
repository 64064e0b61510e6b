# SIMD paths live in files named *_avx2.c / *_avx512.c and get only their own
# ISA flags: the rest of the binary stays baseline x86-64, and the path is
# picked at run time from cpuid (src/quant/quant_dot.c, qt_cpu_isa).
function(strata_isa_flags)
  foreach(f ${ARGN})
    if(f MATCHES "_avx2\\.c$")
      set_source_files_properties(${f} PROPERTIES COMPILE_OPTIONS "-mavx2;-mfma;-mf16c;-mbmi2")
    elseif(f MATCHES "_avx512vbmi\\.c$")
      set_source_files_properties(${f} PROPERTIES COMPILE_OPTIONS
        "-mavx512f;-mavx512bw;-mavx512vl;-mavx512dq;-mavx512vnni;-mavx512vbmi;-mavx2;-mfma;-mf16c;-mbmi2")
    elseif(f MATCHES "_amx\\.c$")
      set_source_files_properties(${f} PROPERTIES COMPILE_OPTIONS
        "-mamx-tile;-mamx-int8;-mavx512f;-mavx512bw;-mavx512vl;-mavx512dq;-mavx512vnni;-mavx2;-mfma;-mf16c;-mbmi2")
    elseif(f MATCHES "_avx512\\.c$")
      set_source_files_properties(${f} PROPERTIES COMPILE_OPTIONS
        "-mavx512f;-mavx512bw;-mavx512vl;-mavx512dq;-mavx512vnni;-mavx2;-mfma;-mf16c;-mbmi2")
    endif()
  endforeach()
endfunction()
