# One layering check (tests/CMakeLists.txt): preprocesses `#include "HEADER"` with a layer's
# include root, as the layer's sources are compiled, and expects it to be found (EXPECT=pass) or
# refused as not found (EXPECT=refuse).
# cmake -DCOMPILER=c++ -DROOT=dir -DINCLUDES="a|b" -DHEADER=core/x.h -DEXPECT=pass -P this
string(REPLACE "|" ";" includes "${INCLUDES}")
set(flags -E -x c++ -std=c++20 -I${ROOT})
foreach(dir IN LISTS includes)
  list(APPEND flags -I${dir})
endforeach()
string(MAKE_C_IDENTIFIER "${ROOT}/${HEADER}" stem)
set(source "${CMAKE_CURRENT_BINARY_DIR}/layering_${stem}.cpp")
file(WRITE "${source}" "#include \"${HEADER}\"\n")
execute_process(COMMAND ${COMPILER} ${flags} ${source} RESULT_VARIABLE rc OUTPUT_QUIET
                ERROR_VARIABLE err)
if(EXPECT STREQUAL "pass" AND NOT rc EQUAL 0)
  message(FATAL_ERROR "${HEADER} should be visible from ${ROOT}, but:\n${err}")
elseif(EXPECT STREQUAL "refuse")
  if(rc EQUAL 0)
    message(FATAL_ERROR "${HEADER} is visible from ${ROOT}: the layer may not include it")
  endif()
  string(FIND "${err}" "${HEADER}" named)
  if(named EQUAL -1)
    message(FATAL_ERROR "refused for another reason than the include itself:\n${err}")
  endif()
endif()
