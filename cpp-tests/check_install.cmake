# cmake -DLIB=<installed libunikv.so.X.Y.Z> -DSONAME=<the package's IMPORTED_SONAME>
#       -DVERSION=X.Y.Z -DREADELF=<readelf> -P check_install.cmake
# The installed library's layout and ABI name: its SONAME follows the version
# rule of CMakeLists.txt and build.rs (0.x: libunikv.so.0.MINOR, from 1.0:
# libunikv.so.MAJOR), the library carries it, the links chain
# libunikv.so -> SONAME -> libunikv.so.X.Y.Z, and no static library is installed.
foreach(var LIB SONAME VERSION READELF)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "check_install.cmake needs -D${var}=...")
  endif()
endforeach()

string(REGEX MATCH "^([0-9]+)\\.([0-9]+)\\.([0-9]+)$" _ "${VERSION}")
if(CMAKE_MATCH_1 EQUAL 0)
  set(expected "libunikv.so.0.${CMAKE_MATCH_2}")
else()
  set(expected "libunikv.so.${CMAKE_MATCH_1}")
endif()
if(NOT SONAME STREQUAL expected)
  message(FATAL_ERROR "package SONAME ${SONAME}, expected ${expected} for version ${VERSION}")
endif()

get_filename_component(libdir "${LIB}" DIRECTORY)
get_filename_component(real_name "${LIB}" NAME)
if(NOT real_name STREQUAL "libunikv.so.${VERSION}" OR IS_SYMLINK "${LIB}")
  message(FATAL_ERROR "${LIB}: expected the regular file libunikv.so.${VERSION}")
endif()

execute_process(COMMAND "${READELF}" -d "${LIB}" OUTPUT_VARIABLE dynamic RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${READELF} -d ${LIB} failed")
endif()
string(REGEX MATCH "Library soname: \\[([^]]*)\\]" _ "${dynamic}")
if(NOT CMAKE_MATCH_1 STREQUAL SONAME)
  message(FATAL_ERROR "${LIB} has SONAME '${CMAKE_MATCH_1}', expected ${SONAME} (build.rs and CMakeLists.txt disagree)")
endif()

foreach(link_target IN ITEMS "${SONAME}:${real_name}" "libunikv.so:${SONAME}")
  string(REPLACE ":" ";" pair "${link_target}")
  list(GET pair 0 link)
  list(GET pair 1 target)
  if(NOT IS_SYMLINK "${libdir}/${link}")
    message(FATAL_ERROR "${libdir}/${link} is not a symlink")
  endif()
  file(READ_SYMLINK "${libdir}/${link}" points_to)
  if(NOT points_to STREQUAL target)
    message(FATAL_ERROR "${libdir}/${link} -> ${points_to}, expected ${target}")
  endif()
endforeach()

if(EXISTS "${libdir}/libunikv.a")
  message(FATAL_ERROR "${libdir}/libunikv.a is installed: the package ships no static library")
endif()
message(STATUS "${SONAME} -> ${real_name}, SONAME matches version ${VERSION}")
