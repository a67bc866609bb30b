# triad-eval on the simulated GPU (support/cuda_sim) against the CPU: the
# same question and text scores in f32 to rounding, and in bf16 within half
# precision's error.
# Variables: EVAL (triad-eval), SIM_EVAL (triad-eval-sim), RUN (a
# triad-train output.dir), QUESTIONS (JSON lines), WORK.
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
function(eval program name)
  execute_process(COMMAND ${program} --run ${RUN} --choices ${QUESTIONS} --text ${QUESTIONS}
                          --json --predictions ${WORK}/${name}.jsonl ${ARGN}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE text ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${program} ${ARGN} exited ${rc}: ${text}${err}")
  endif()
  message(STATUS "${name}: ${text}")
  set(${name} "${text}" PARENT_SCOPE)
endfunction()
# A non-negative JSON number below 10^4 as millionths (CMake has no
# floating point).
function(millionths value out)
  if(NOT value MATCHES "^([0-9]+)([.]([0-9]*))?$")
    message(FATAL_ERROR "'${value}' is not a non-negative number without an exponent")
  endif()
  set(whole ${CMAKE_MATCH_1})
  string(SUBSTRING "${CMAKE_MATCH_3}000000" 0 6 frac)
  # (A leading 1 keeps the fraction's zeros: math would read 000050 as octal
  # or stop, and a REGEX REPLACE anchored at ^ strips zeros from the middle.)
  math(EXPR m "${whole} * 1000000 + 1${frac} - 1000000")
  set(${out} ${m} PARENT_SCOPE)
endfunction()
# |a - b| <= tol (all in millionths).
function(expect_close a b tol what)
  millionths("${a}" am)
  millionths("${b}" bm)
  math(EXPR diff "${am} - ${bm}")
  if(diff GREATER ${tol} OR diff LESS -${tol})
    message(FATAL_ERROR "${what}: ${a} on the simulated GPU, ${b} on the CPU")
  endif()
endfunction()

eval(${EVAL} cpu --device cpu)
foreach(dtype f32 bf16)
  if(dtype STREQUAL f32)
    set(tol 100)  # 1e-4 nats
  else()
    set(tol 10000)  # 0.01 nats: bf16 weights and activations
  endif()
  eval(${SIM_EVAL} sim_${dtype} --device cuda --dtype ${dtype})
  string(JSON a GET "${sim_${dtype}}" text ${QUESTIONS} loss)
  string(JSON b GET "${cpu}" text ${QUESTIONS} loss)
  expect_close("${a}" "${b}" ${tol} "${dtype} text loss")
  # Each choice's score per token.
  file(STRINGS ${WORK}/cpu.jsonl cpu_rows)
  file(STRINGS ${WORK}/sim_${dtype}.jsonl sim_rows)
  foreach(row_a row_b IN ZIP_LISTS sim_rows cpu_rows)
    string(JSON count LENGTH "${row_b}" nll)
    math(EXPR last "${count} - 1")
    foreach(i RANGE ${last})
      string(JSON na GET "${row_a}" nll ${i})
      string(JSON nb GET "${row_b}" nll ${i})
      string(JSON tokens GET "${row_b}" tokens ${i})
      math(EXPR row_tol "${tol} * ${tokens}")
      expect_close("${na}" "${nb}" ${row_tol} "${dtype} choice ${i} of ${row_b}")
    endforeach()
  endforeach()
endforeach()
