# triad-generate --interactive: with a chat template, the lines of stdin
# are the user's turns of one conversation (each prompt holds every turn so
# far, "/reset" starts again); without one, each line is a prompt of its
# own, printed with its continuation; either way the key/value cache stays
# from one turn to the next.
# Variables: GENERATE (triad-generate), CHAT_RUN (a chat model's output.dir),
# TOKENIZER (its tokenizer.json), RUN (a plain model's), WORK.
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
# talk(INPUT ARGS...): triad-generate -i with INPUT's lines on stdin; its
# stdout and stderr in `out` and `err`.
function(talk input)
  file(WRITE ${WORK}/stdin.txt "${input}")
  execute_process(COMMAND ${GENERATE} -i --temperature 0 --timing ${ARGN}
                  INPUT_FILE ${WORK}/stdin.txt RESULT_VARIABLE rc OUTPUT_VARIABLE o ERROR_VARIABLE e)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "triad-generate -i ${ARGN} exited ${rc}: ${o}${e}")
  endif()
  set(out "${o}" PARENT_SCOPE)
  set(err "${e}" PARENT_SCOPE)
endfunction()
talk("1+2\n\n2+3\n/reset\n1+2\n" --run ${CHAT_RUN} --chat-template chatml --system Add.
     --tokens 4 --tokenizer ${TOKENIZER})
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
talk("Once\nThe cat\n" --run ${RUN} --tokens 8)
if(NOT out MATCHES "^Once[^\n]*\nThe cat[^\n]*\n$")
  message(FATAL_ERROR "each line and its continuation expected:\n${out}")
endif()
if(NOT err MATCHES "\\(prompt 4\\).*\\(prompt 7\\)")
  message(FATAL_ERROR "each line should be a prompt of its own (4 and 7 bytes):\n${err}")
endif()
# The cache stays from turn to turn: a prompt that begins with the last
# one (and maybe its reply) decodes only what follows.
talk("Once upon\nOnce upon a time\n" --run ${RUN} --tokens 8)
if(NOT err MATCHES "\\(prompt 16\\)[^\n]*, ([0-9]+) prompt tokens from the last turn")
  message(FATAL_ERROR "the second prompt should reuse the first's cache:\n${err}")
endif()
if(CMAKE_MATCH_1 LESS 9)
  message(FATAL_ERROR "only ${CMAKE_MATCH_1} of the 9 shared tokens came from the cache:\n${err}")
endif()
