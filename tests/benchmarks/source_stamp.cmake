# benchmarks/gpu/source_stamp.sh decides whether a lent GPU machine may run a
# pack of programs built elsewhere, so it must change with every file the
# programs are compiled from and with nothing else: a stale pack would run
# old code, and a stamp that moves with a Python baseline or a shell script
# would throw a good pack away and spend the GPU's minutes compiling.
# Variables: SCRIPT (source_stamp.sh), WORK.
file(REMOVE_RECURSE ${WORK})
foreach(dir cmake src include/triad kernels tests benchmarks/gpu examples)
  file(MAKE_DIRECTORY ${WORK}/${dir})
endforeach()
file(WRITE ${WORK}/CMakeLists.txt "project(x)\n")
file(WRITE ${WORK}/src/a.cpp "int a() { return 1; }\n")
file(WRITE ${WORK}/kernels/k.cu "__global__ void k() {}\n")
file(WRITE ${WORK}/benchmarks/torch_gpt.py "print(1)\n")
file(WRITE ${WORK}/benchmarks/gpu/run_all.sh "echo 1\n")
file(WRITE ${WORK}/tests/README.md "one\n")

function(stamp out)
  execute_process(COMMAND bash ${SCRIPT} ${WORK} OUTPUT_VARIABLE s RESULT_VARIABLE rc
                  ERROR_VARIABLE err OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT rc EQUAL 0 OR NOT s MATCHES "^[0-9a-f][0-9a-f][0-9a-f][0-9a-f]+$")
    message(FATAL_ERROR "source_stamp.sh failed (${rc}): '${s}' ${err}")
  endif()
  set(${out} "${s}" PARENT_SCOPE)
endfunction()

stamp(first)
# Read from the tree when they run, never compiled: the stamp stays.
file(WRITE ${WORK}/benchmarks/torch_gpt.py "print(2)\n")
file(WRITE ${WORK}/benchmarks/gpu/run_all.sh "echo 2\n")
file(WRITE ${WORK}/tests/README.md "two\n")
file(WRITE ${WORK}/tests/new_reference.py "print(3)\n")
stamp(same)
if(NOT same STREQUAL first)
  message(FATAL_ERROR "the stamp moved (${first} -> ${same}) with only .py, .sh and .md files changed")
endif()
# Compiled in: every change moves it.
set(last ${same})
foreach(change "src/a.cpp;int a() { return 2; }" "kernels/k.cu;__global__ void k2() {}"
               "include/triad/new.h;#pragma once" "CMakeLists.txt;project(y)"
               "tests/CMakeLists.txt;add_test(NAME t COMMAND t)")
  list(GET change 0 path)
  list(GET change 1 text)
  file(WRITE ${WORK}/${path} "${text}\n")
  stamp(now)
  if(now STREQUAL last)
    message(FATAL_ERROR "the stamp did not move when ${path} changed (${now})")
  endif()
  set(last ${now})
endforeach()
# A file renamed with its content unchanged moves it too (paths are hashed).
file(RENAME ${WORK}/src/a.cpp ${WORK}/src/b.cpp)
stamp(renamed)
if(renamed STREQUAL last)
  message(FATAL_ERROR "the stamp did not move when src/a.cpp was renamed")
endif()
message(STATUS "source_stamp.sh: ${first} (unchanged by .py/.sh/.md), moved by each compiled file")
