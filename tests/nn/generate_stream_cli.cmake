# triad-generate writes a reply as it is generated (data::TextStream) and
# writes exactly what --no-stream writes once the reply is complete: greedy
# and sampled (hot, so bytes that are not whole characters come up), cut at
# stop strings or running to --tokens, a chat model's replies ending at its
# end-of-turn token (the built-in template's and the model's own program's:
# the reply alone, never the prompt), and a conversation from stdin.
# Variables: GENERATE (triad-generate), RUN (a plain model's output.dir),
# CHAT_RUN (a chat model's), TOKENIZER (its tokenizer.json), WORK.
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
file(WRITE ${WORK}/stdin.txt "1+2\n2+3\n")
set(case_1 --run ${RUN} --prompt "Once upon" --tokens 40 --temperature 0)
set(case_2 --run ${RUN} --prompt "Onceupon" --tokens 60 --temperature 0 --stop " " --stop "e")
set(case_3 --run ${RUN} --prompt "The" --tokens 80 --temperature 1.5 --seed 3 --stop "the")
set(case_4 --run ${RUN} --prompt "A" --tokens 80 --temperature 2.0 --seed 11)
set(case_5 --run ${CHAT_RUN} --chat-template chatml --system Add. --prompt "1+2" --tokens 12
    --temperature 0.8 --seed 5 --tokenizer ${TOKENIZER})
set(case_6 -i --run ${CHAT_RUN} --chat-template chatml --tokens 12 --temperature 0.8 --seed 5
    --tokenizer ${TOKENIZER})
set(case_7 --run ${CHAT_RUN} --chat-template model --system Add. --prompt "1+2" --tokens 12
    --temperature 0.8 --seed 5 --tokenizer ${TOKENIZER})
foreach(i RANGE 1 7)
  foreach(mode stream no_stream)
    set(extra "")
    if(mode STREQUAL "no_stream")
      set(extra --no-stream)
    endif()
    execute_process(COMMAND ${GENERATE} ${case_${i}} ${extra} INPUT_FILE ${WORK}/stdin.txt
                    RESULT_VARIABLE rc OUTPUT_VARIABLE out_${mode} ERROR_VARIABLE err)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "case ${i} (${mode}) exited ${rc}: ${out_${mode}}${err}")
    endif()
  endforeach()
  if(NOT out_stream STREQUAL out_no_stream)
    message(FATAL_ERROR "case ${i}: streamed\n[${out_stream}]\nbut complete replies\n"
                        "[${out_no_stream}]")
  endif()
  if(out_stream STREQUAL "")
    message(FATAL_ERROR "case ${i} wrote nothing")
  endif()
  if(i EQUAL 7 AND out_stream MATCHES "^1\\+2")
    message(FATAL_ERROR "case 7 wrote the prompt before the reply: ${out_stream}")
  endif()
  message(STATUS "case ${i}: ${out_stream}")
endforeach()
