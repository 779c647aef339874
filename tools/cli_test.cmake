# Runs one memeff command line for CTest and checks its outcome: the exit status, that stdout and
# stderr match their regexes, and that stdout is one JSON object holding the keys asked for (read
# with CMake's own JSON reader, so no other tool is needed).
#
# Usage: cmake -DMEMEFF=<program> "-DARGS=run|--device|cpu" [-DEXPECT_RC=2 (default 0)]
#   [-DJSON_KEYS=backend|max_abs_err.out] [-DJSON_TRUE=pass] [-DEXPECT_STDERR=regex]
#   [-DEXPECT_STDOUT=regex] -P cli_test.cmake
cmake_minimum_required(VERSION 3.24)
if(NOT DEFINED EXPECT_RC)
  set(EXPECT_RC 0)
endif()
# Lists arrive joined with '|' (see tools/CMakeLists.txt).
string(REPLACE "|" ";" ARGS "${ARGS}")
string(REPLACE "|" ";" JSON_KEYS "${JSON_KEYS}")
string(REPLACE "|" ";" JSON_TRUE "${JSON_TRUE}")
execute_process(COMMAND ${MEMEFF} ${ARGS} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
string(REPLACE ";" " " shown "${ARGS}")
if(NOT rc STREQUAL "${EXPECT_RC}")
  message(FATAL_ERROR "memeff ${shown}: exit status ${rc}, expected ${EXPECT_RC}\nstdout:\n${out}\nstderr:\n${err}")
endif()
if(DEFINED EXPECT_STDOUT AND NOT out MATCHES "${EXPECT_STDOUT}")
  message(FATAL_ERROR "memeff ${shown}: stdout does not match `${EXPECT_STDOUT}`:\n${out}")
endif()
if(DEFINED EXPECT_STDERR AND NOT err MATCHES "${EXPECT_STDERR}")
  message(FATAL_ERROR "memeff ${shown}: stderr does not match `${EXPECT_STDERR}`:\n${err}")
endif()
# Keys are paths with dots: max_abs_err.out
foreach(key IN LISTS JSON_KEYS)
  string(REPLACE "." ";" path "${key}")
  string(JSON value ERROR_VARIABLE json_error GET "${out}" ${path})
  if(json_error)
    message(FATAL_ERROR "memeff ${shown}: JSON output lacks `${key}` (${json_error}):\n${out}")
  endif()
endforeach()
foreach(key IN LISTS JSON_TRUE)
  string(REPLACE "." ";" path "${key}")
  string(JSON value ERROR_VARIABLE json_error GET "${out}" ${path})
  if(json_error OR NOT value STREQUAL "ON")
    message(FATAL_ERROR "memeff ${shown}: JSON `${key}` is not true (${value}${json_error}):\n${out}")
  endif()
endforeach()
message(STATUS "memeff ${shown}: exit ${rc} as expected\n${out}")
