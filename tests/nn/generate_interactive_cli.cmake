# triad-generate --interactive: with a chat template, the lines of stdin
# are the user's turns of one conversation (each prompt holds every turn so
# far, "/reset" starts again); without one, each line is a prompt of its
# own, printed with its continuation.
# Variables: GENERATE (triad-generate), CHAT_RUN (a chat model's output.dir),
# TOKENIZER (its tokenizer.json), RUN (a plain model's), WORK.
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
file(WRITE ${WORK}/turns.txt "1+2\n\n2+3\n/reset\n1+2\n")
execute_process(COMMAND ${GENERATE} --run ${CHAT_RUN} --chat-template chatml --system Add. -i
                        --tokens 4 --temperature 0 --timing --tokenizer ${TOKENIZER}
                INPUT_FILE ${WORK}/turns.txt RESULT_VARIABLE rc OUTPUT_VARIABLE out
                ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "triad-generate -i exited ${rc}: ${out}${err}")
endif()
string(REGEX MATCHALL "\\(prompt ([0-9]+)\\)" prompts "${err}")
list(LENGTH prompts n)
if(NOT n EQUAL 3)
  message(FATAL_ERROR "${n} answers to 3 turns (the blank line is no turn):\n${err}")
endif()
set(sizes "")
foreach(p IN LISTS prompts)
  string(REGEX REPLACE "[^0-9]" "" size "${p}")
  list(APPEND sizes ${size})
endforeach()
list(GET sizes 0 first)
list(GET sizes 1 second)
list(GET sizes 2 third)
# The second turn's prompt holds the first exchange and its own question;
# after /reset the prompt is the first turn's again.
if(NOT second GREATER first OR NOT third EQUAL first)
  message(FATAL_ERROR "prompt sizes ${sizes}: the second turn should hold the first, "
                      "and /reset should start over")
endif()
string(REGEX MATCHALL "\n" lines "${out}")
list(LENGTH lines printed)
if(NOT printed EQUAL 3)
  message(FATAL_ERROR "${printed} replies printed for 3 turns:\n${out}")
endif()
# Without a template each line is its own prompt, continued after it.
file(WRITE ${WORK}/lines.txt "Once\nThe cat\n")
execute_process(COMMAND ${GENERATE} --run ${RUN} -i --tokens 8 --temperature 0 --timing
                INPUT_FILE ${WORK}/lines.txt RESULT_VARIABLE rc OUTPUT_VARIABLE out
                ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "triad-generate -i exited ${rc}: ${out}${err}")
endif()
if(NOT out MATCHES "^Once[^\n]*\nThe cat[^\n]*\n$")
  message(FATAL_ERROR "each line and its continuation expected:\n${out}")
endif()
if(NOT err MATCHES "\\(prompt 4\\).*\\(prompt 7\\)")
  message(FATAL_ERROR "each line should be a prompt of its own (4 and 7 bytes):\n${err}")
endif()
