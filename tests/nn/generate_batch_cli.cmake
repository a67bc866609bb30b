# triad-generate --prompts answers prompts together (--batch) with the
# replies each gets alone: prompts of different lengths, sampled with
# penalties, some ending at a stop string, give the same JSON lines in
# the same order with --batch 1 (one at a time), --batch 3 (a short last
# batch) and --batch 16 (all at once); the timing line says how many ran
# together, and batches hold prompts of about one length. A bad line stops
# the run before any reply is generated.
# Variables: GENERATE (triad-generate), RUN (a triad-train output.dir), WORK.
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
set(prompts "")
foreach(p "Once" "Once upon a time there" "The" "It was a dark and stormy night, and" "A"
          "Onceupon" "Over the hills")
  string(APPEND prompts "{\"prompt\": \"${p}\"}\n")
endforeach()
file(WRITE ${WORK}/prompts.jsonl "${prompts}")
set(common --run ${RUN} --prompts ${WORK}/prompts.jsonl --tokens 24 --temperature 0.9 --top-k 20
    --repetition-penalty 1.2 --seed 7 --stop "r" --timing)
foreach(batch 1 3 16)
  execute_process(COMMAND ${GENERATE} ${common} --batch ${batch} RESULT_VARIABLE rc
                  OUTPUT_VARIABLE out_${batch} ERROR_VARIABLE err_${batch})
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "--batch ${batch} exited ${rc}: ${out_${batch}}${err_${batch}}")
  endif()
endforeach()
message(STATUS "--batch 3:\n${out_3}${err_3}")
string(REGEX MATCHALL "\n" lines "${out_1}")
list(LENGTH lines n)
if(NOT n EQUAL 7)
  message(FATAL_ERROR "${n} replies to 7 prompts:\n${out_1}")
endif()
foreach(batch 3 16)
  if(NOT out_${batch} STREQUAL out_1)
    message(FATAL_ERROR "--batch ${batch} answered otherwise than one at a time:\n"
                        "${out_${batch}}\n--batch 1:\n${out_1}")
  endif()
endforeach()
# The replies differ (the prompts are not all answered alike), and the
# stop string ended some early: the batch's rows ended at different steps.
string(REGEX MATCHALL "\"response\":\"[^\"]*\"" replies "${out_1}")
list(REMOVE_DUPLICATES replies)
list(LENGTH replies distinct)
if(distinct LESS 3)
  message(FATAL_ERROR "only ${distinct} distinct replies:\n${out_1}")
endif()
if(NOT err_3 MATCHES "3 prompts together" OR NOT err_3 MATCHES "1 prompts together|\\(prompt [0-9]+\\)")
  message(FATAL_ERROR "--batch 3's timing lines do not say how many ran together:\n${err_3}")
endif()
# Batches hold prompts of about one length (shortest first): --batch 3's
# batches of 3 cover token ranges that do not overlap, in rising order (in
# the file's order they would: its lengths go short, long, short, ...).
string(REGEX MATCHALL "together of [0-9]+-[0-9]+ tokens" ranges "${err_3}")
list(LENGTH ranges n_ranges)
if(n_ranges LESS 2)
  message(FATAL_ERROR "--batch 3's timing lines name fewer than 2 batches' lengths:\n${err_3}")
endif()
set(previous -1)
foreach(range IN LISTS ranges)
  string(REGEX MATCH "of ([0-9]+)-([0-9]+)" _ "${range}")
  if(NOT CMAKE_MATCH_1 GREATER_EQUAL previous)
    message(FATAL_ERROR "--batch 3 batched prompts of overlapping lengths:\n${err_3}")
  endif()
  set(previous ${CMAKE_MATCH_2})
endforeach()
if(NOT err_16 MATCHES "^([0-9]+) tokens [^\n]*7 prompts together")
  message(FATAL_ERROR "--batch 16 did not answer all 7 together:\n${err_16}")
endif()
if(NOT CMAKE_MATCH_1 LESS 168)
  message(FATAL_ERROR "every reply ran to --tokens 24 (${CMAKE_MATCH_1} tokens): no stop tested")
endif()
# Every line is checked before anything is generated: a bad line near the
# end stops the run with the line named, and no reply has been written.
file(WRITE ${WORK}/bad.jsonl "{\"prompt\": \"Once\"}\n{\"prompt\": \"The\"}\n{\"prompt\": 3}\n")
execute_process(COMMAND ${GENERATE} --run ${RUN} --prompts ${WORK}/bad.jsonl --tokens 4 --batch 1
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT err MATCHES "bad.jsonl' line 3 has no string \"prompt\"")
  message(FATAL_ERROR "a bad third line should stop the run naming it (exit ${rc}):\n${out}${err}")
endif()
if(NOT out STREQUAL "")
  message(FATAL_ERROR "replies were written before the bad line was found:\n${out}")
endif()
