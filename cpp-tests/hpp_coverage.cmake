# cmake -DINCLUDE_DIR=<dir> -P hpp_coverage.cmake: every function declared in
# <dir>/unikv.h is called by <dir>/unikv.hpp (the C++ bindings cover the whole
# C API), so a new entry point cannot be forgotten there.
file(READ "${INCLUDE_DIR}/unikv.h" c_header)
file(READ "${INCLUDE_DIR}/unikv.hpp" cpp_header)
# Declarations: a return type at the start of a line, then `unikv_name(`.
string(REGEX MATCHALL "\n(UNIKV_NODISCARD[ \n]*)?(unikv_status|void|uint32_t|const char \\*) *unikv_[a-z0-9_]+\\("
       declarations "${c_header}")
set(count 0)
set(missing "")
foreach(decl IN LISTS declarations)
  string(REGEX MATCH "unikv_[a-z0-9_]+\\($" name "${decl}")
  string(REGEX REPLACE "\\($" "" name "${name}")
  math(EXPR count "${count} + 1")
  # Called, or passed as a destroy function to the handle template.
  string(REGEX MATCH "${name}[(>]" used "${cpp_header}")
  if(NOT used)
    list(APPEND missing "${name}")
  endif()
endforeach()
if(count LESS 40)
  message(FATAL_ERROR "found only ${count} declarations in unikv.h: the pattern is out of date")
endif()
if(missing)
  message(FATAL_ERROR "unikv.hpp does not wrap: ${missing}")
endif()
message(STATUS "unikv.hpp wraps all ${count} functions of unikv.h")
