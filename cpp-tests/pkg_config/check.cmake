# cmake -DPKG_CONFIG=... -DPREFIX=<install prefix> -DCC=<C compiler>
#       -DSOURCE=main.c -DWORK=<folder> -DVERSION=X.Y.Z -P check.cmake
# Links a C program with nothing but `pkg-config --cflags --libs unikv`, with
# PKG_CONFIG_PATH at the install prefix, and runs it; the prefix pkg-config
# reports must be the install prefix (the .pc file is relocatable).
foreach(var PKG_CONFIG PREFIX CC SOURCE WORK VERSION)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "check.cmake needs -D${var}=...")
  endif()
endforeach()

file(GLOB pc_files "${PREFIX}/lib*/pkgconfig/unikv.pc" "${PREFIX}/lib*/*/pkgconfig/unikv.pc")
if(NOT pc_files)
  message(FATAL_ERROR "no unikv.pc under ${PREFIX}/lib*")
endif()
list(GET pc_files 0 pc_file)
get_filename_component(pc_dir "${pc_file}" DIRECTORY)
set(ENV{PKG_CONFIG_PATH} "${pc_dir}")
# Nothing from the host's own pkg-config folders.
set(ENV{PKG_CONFIG_LIBDIR} "${pc_dir}")

function(pkg_config out)
  execute_process(COMMAND "${PKG_CONFIG}" ${ARGN} unikv
                  OUTPUT_VARIABLE value ERROR_VARIABLE error RESULT_VARIABLE rc
                  OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "pkg-config ${ARGN} unikv failed (${rc}): ${error}")
  endif()
  set(${out} "${value}" PARENT_SCOPE)
endfunction()

pkg_config(modversion --modversion)
if(NOT modversion STREQUAL VERSION)
  message(FATAL_ERROR "pkg-config --modversion: ${modversion}, expected ${VERSION}")
endif()
pkg_config(prefix --variable=prefix)
file(REAL_PATH "${prefix}" prefix)
file(REAL_PATH "${PREFIX}" expected_prefix)
if(NOT prefix STREQUAL expected_prefix)
  message(FATAL_ERROR "unikv.pc prefix ${prefix}, expected ${expected_prefix}")
endif()
pkg_config(libdir --variable=libdir)
pkg_config(flags --cflags --libs)
message(STATUS "pkg-config --cflags --libs unikv: ${flags}")
separate_arguments(flags UNIX_COMMAND "${flags}")

file(MAKE_DIRECTORY "${WORK}")
set(program "${WORK}/pkg_config_main")
execute_process(COMMAND "${CC}" -std=c99 -Wall -Wextra -Werror "${SOURCE}" -o "${program}" ${flags}
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "compiling and linking with the pkg-config flags failed")
endif()
# The flags carry no RPATH: the program finds the library through
# LD_LIBRARY_PATH, as the .pc file says.
set(ENV{LD_LIBRARY_PATH} "${libdir}")
execute_process(COMMAND "${program}" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${program} failed (${rc})")
endif()
