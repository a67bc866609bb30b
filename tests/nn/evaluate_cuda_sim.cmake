# triad-eval on the simulated GPU (support/cuda_sim) against the CPU: the
# same question, LAMBADA and text scores in f32 to rounding (and the same
# LAMBADA words greedy, and the same GSM8K replies generated over the
# device's key/value cache, in batches, to --gen-tokens: the tiny model
# answers with spaces, so this checks the decoding runs and ends as the
# CPU's, not what it writes), and in bf16 within half precision's error; and
# questions that share a beginning (read once, its cache copied on the
# device) in f32.
# Variables: EVAL (triad-eval), SIM_EVAL (triad-eval-sim), RUN (a
# triad-train output.dir), QUESTIONS (JSON lines), LAMBADA (JSON lines of
# text), PROBLEMS (GSM8K's JSON lines), WORK.
include(${CMAKE_CURRENT_LIST_DIR}/eval_common.cmake)
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
function(eval program name)
  execute_process(COMMAND ${program} --run ${RUN} --choices ${QUESTIONS} --text ${QUESTIONS}
                          --lambada ${LAMBADA} --gsm8k ${PROBLEMS} --gen-tokens 24 --json
                          --predictions ${WORK}/${name}.jsonl ${ARGN}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE text ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${program} ${ARGN} exited ${rc}: ${text}${err}")
  endif()
  message(STATUS "${name}: ${text}")
  set(${name} "${text}" PARENT_SCOPE)
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
  expect_within("${a}" "${b}" ${tol} "${dtype} text loss (the simulated GPU, the CPU)")
  # Each choice's score per token.
  file(STRINGS ${WORK}/cpu.jsonl cpu_rows)
  file(STRINGS ${WORK}/sim_${dtype}.jsonl sim_rows)
  set(replies 0)
  foreach(row_a row_b IN ZIP_LISTS sim_rows cpu_rows)
    string(JSON reply_b ERROR_VARIABLE no_reply GET "${row_b}" reply)
    if(NOT no_reply)  # a GSM8K problem's reply
      string(JSON reply_a GET "${row_a}" reply)
      if(dtype STREQUAL f32 AND NOT reply_a STREQUAL reply_b)
        message(FATAL_ERROR "f32 GSM8K reply '${reply_a}' on the simulated GPU, '${reply_b}' on "
                            "the CPU: ${row_b}")
      endif()
      math(EXPR replies "${replies} + 1")
      continue()
    endif()
    string(JSON kind TYPE "${row_b}" nll)
    if(kind STREQUAL "NUMBER")  # a LAMBADA text's word
      string(JSON na GET "${row_a}" nll)
      string(JSON nb GET "${row_b}" nll)
      string(JSON tokens GET "${row_b}" tokens)
      math(EXPR row_tol "${tol} * ${tokens}")
      expect_within("${na}" "${nb}" ${row_tol} "${dtype} LAMBADA word of ${row_b}")
      string(JSON ga GET "${row_a}" greedy)
      string(JSON gb GET "${row_b}" greedy)
      if(dtype STREQUAL f32 AND NOT ga STREQUAL gb)
        message(FATAL_ERROR "f32 LAMBADA word greedy ${ga} on the simulated GPU, ${gb} on the "
                            "CPU: ${row_b}")
      endif()
      continue()
    endif()
    string(JSON count LENGTH "${row_b}" nll)
    math(EXPR last "${count} - 1")
    foreach(i RANGE ${last})
      string(JSON na GET "${row_a}" nll ${i})
      string(JSON nb GET "${row_b}" nll ${i})
      string(JSON tokens GET "${row_b}" tokens ${i})
      math(EXPR row_tol "${tol} * ${tokens}")
      expect_within("${na}" "${nb}" ${row_tol} "${dtype} choice ${i} of ${row_b} (the simulated GPU, the CPU)")
    endforeach()
  endforeach()
  if(NOT replies EQUAL 3)
    message(FATAL_ERROR "${replies} GSM8K replies compared, the file has 3 problems")
  endif()
endforeach()

# Questions whose contexts begin alike (a family: the beginning runs once
# and its keys and values are copied into each batch's cache on the device)
# score as on the CPU in f32.
file(WRITE ${WORK}/family.jsonl
     "{\"context\": \"read this first, it is the same for every question: the fox\", \"choices\": [\" runs\", \" sleeps\", \" reads a book\"], \"answer\": 0}\n"
     "{\"context\": \"read this first, it is the same for every question: in the city the old man\", \"choices\": [\" paints\", \" sky\"], \"answer\": 0}\n"
     "{\"context\": \"read this first, it is the same for every question: a\", \"choices\": [\" child\", \" garden on sunday\", \" zzz\"], \"answer\": 1}\n")
foreach(program IN ITEMS ${EVAL} ${SIM_EVAL})
  set(device cpu)
  if(program STREQUAL SIM_EVAL OR program STREQUAL "${SIM_EVAL}")
    set(device cuda)
  endif()
  execute_process(COMMAND ${program} --run ${RUN} --choices ${WORK}/family.jsonl --device ${device}
                          --batch 3 --predictions ${WORK}/family_${device}.jsonl
                  RESULT_VARIABLE rc OUTPUT_VARIABLE text ERROR_VARIABLE err)
  if(NOT rc EQUAL 0 OR NOT err MATCHES " of them 1 shared beginnings read once")
    message(FATAL_ERROR "${program} on the family's questions: exit ${rc}, ${text}${err}")
  endif()
endforeach()
file(STRINGS ${WORK}/family_cpu.jsonl cpu_rows)
file(STRINGS ${WORK}/family_cuda.jsonl sim_rows)
foreach(row_a row_b IN ZIP_LISTS sim_rows cpu_rows)
  string(JSON count LENGTH "${row_b}" nll)
  math(EXPR last "${count} - 1")
  foreach(i RANGE ${last})
    string(JSON na GET "${row_a}" nll ${i})
    string(JSON nb GET "${row_b}" nll ${i})
    expect_within("${na}" "${nb}" 1000 "f32 choice ${i} of the family's ${row_b} (the simulated GPU, the CPU)")
  endforeach()
endforeach()
