# triad-eval end to end on the tiny model: its accuracies are the share of
# its own per-question picks that are right, its text scores every token
# but the first once (however the windows stride), several files add up,
# and a bad question stops it with the line named.
# WinoGrande's lines score each option's sentence by what follows the blank.
# Variables: EVAL (triad-eval), RUN (a triad-train output.dir), QUESTIONS
# (JSON lines), WINOGRANDE (WinoGrande's JSON lines), WORK.
include(${CMAKE_CURRENT_LIST_DIR}/eval_common.cmake)
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
function(eval out)
  execute_process(COMMAND ${EVAL} --run ${RUN} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE text
                  ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "triad-eval ${ARGN} exited ${rc}: ${text}${err}")
  endif()
  set(${out} "${text}" PARENT_SCOPE)
endfunction()
eval(report --choices ${QUESTIONS} --text ${QUESTIONS} --json --predictions ${WORK}/p.jsonl)
message(STATUS "${report}")
string(JSON q GET "${report}" choices ${QUESTIONS} questions)
file(STRINGS ${QUESTIONS} lines REGEX "[{]")
list(LENGTH lines n)
if(NOT q EQUAL n)
  message(FATAL_ERROR "${q} questions scored, the file has ${n}")
endif()
file(STRINGS ${WORK}/p.jsonl rows)
list(LENGTH rows rows_n)
if(NOT rows_n EQUAL n)
  message(FATAL_ERROR "${rows_n} prediction lines for ${n} questions")
endif()
foreach(pick pick pick_norm pick_per_token)
  set(right 0)
  foreach(row IN LISTS rows)
    string(JSON p GET "${row}" ${pick})
    string(JSON a GET "${row}" answer)
    string(JSON chosen LENGTH "${row}" nll)
    if(p GREATER_EQUAL chosen)
      message(FATAL_ERROR "${pick} ${p} is not one of ${chosen} choices: ${row}")
    endif()
    if(p EQUAL a)
      math(EXPR right "${right} + 1")
    endif()
  endforeach()
  set(metric_pick pick acc pick_norm acc_norm pick_per_token acc_per_token)
  list(FIND metric_pick ${pick} i)
  math(EXPR i "${i} + 1")
  list(GET metric_pick ${i} metric)
  string(JSON acc GET "${report}" choices ${QUESTIONS} ${metric})
  millionths("${acc}" got)
  math(EXPR want "${right} * 1000000 / ${n}")
  math(EXPR diff "${got} - ${want}")
  if(diff GREATER 1 OR diff LESS -1)
    message(FATAL_ERROR "${metric} ${acc}, but ${right} of ${n} picks are right")
  endif()
endforeach()

# Every byte but the first is scored, in windows of seq_len or of 16.
file(SIZE ${QUESTIONS} bytes)
math(EXPR want "${bytes} - 1")
string(JSON tokens GET "${report}" text ${QUESTIONS} tokens)
string(JSON loss GET "${report}" text ${QUESTIONS} loss)
if(NOT tokens EQUAL want)
  message(FATAL_ERROR "${tokens} tokens scored of ${bytes}")
endif()
eval(strided --text ${QUESTIONS} --stride 16 --json)
string(JSON tokens16 GET "${strided}" text ${QUESTIONS} tokens)
string(JSON loss16 GET "${strided}" text ${QUESTIONS} loss)
if(NOT tokens16 EQUAL want OR loss16 STREQUAL loss)
  message(FATAL_ERROR "stride 16: ${tokens16} tokens, loss ${loss16} (seq_len's: ${loss})")
endif()
# Two files: twice the tokens at the same loss.
eval(both --text ${QUESTIONS} --text ${QUESTIONS} --json)
string(JSON all_tokens GET "${both}" text_all tokens)
string(JSON all_loss GET "${both}" text_all loss)
math(EXPR twice "2 * ${want}")
if(NOT all_tokens EQUAL twice)
  message(FATAL_ERROR "two files: ${all_tokens} tokens, not ${twice}")
endif()
expect_within("${all_loss}" "${loss}" 2 "two files' loss")

# A question with its label outside its choices.
file(WRITE ${WORK}/bad.jsonl "{\"context\": \"a\", \"choices\": [\"b\", \"c\"], \"answer\": 0}\n"
                             "{\"context\": \"a\", \"choices\": [\"b\", \"c\"], \"answer\": 5}\n")
execute_process(COMMAND ${EVAL} --run ${RUN} --choices ${WORK}/bad.jsonl RESULT_VARIABLE rc
                OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 2 OR NOT "${out}${err}" MATCHES "bad.jsonl' line 2: label 5 is not a choice's index in \\[0, 2\\)")
  message(FATAL_ERROR "a bad label: exit ${rc}, ${out}${err}")
endif()

# WinoGrande: both options are scored on the same continuation (what
# follows the blank) after contexts of their own, so the two scores differ
# while the three normalisations pick alike.
eval(wino --choices ${WINOGRANDE} --json --predictions ${WORK}/wino.jsonl)
string(JSON acc GET "${wino}" choices ${WINOGRANDE} acc)
string(JSON acc_norm GET "${wino}" choices ${WINOGRANDE} acc_norm)
string(JSON acc_per_token GET "${wino}" choices ${WINOGRANDE} acc_per_token)
string(JSON wino_q GET "${wino}" choices ${WINOGRANDE} questions)
if(NOT wino_q EQUAL 4 OR NOT acc STREQUAL acc_norm OR NOT acc STREQUAL acc_per_token)
  message(FATAL_ERROR "WinoGrande: ${wino_q} questions, acc ${acc}, acc_norm ${acc_norm}, "
                      "acc_per_token ${acc_per_token}")
endif()
file(STRINGS ${WORK}/wino.jsonl wino_rows)
foreach(row IN LISTS wino_rows)
  string(JSON a GET "${row}" answer)
  string(JSON nll0 GET "${row}" nll 0)
  string(JSON nll1 GET "${row}" nll 1)
  string(JSON t0 GET "${row}" tokens 0)
  string(JSON t1 GET "${row}" tokens 1)
  if(nll0 STREQUAL nll1 OR NOT t0 EQUAL t1 OR a GREATER 1)
    message(FATAL_ERROR "WinoGrande: scores ${nll0} and ${nll1} of ${t0} and ${t1} tokens, "
                        "answer ${a}: ${row}")
  endif()
endforeach()

# Few-shot: the same questions asked after a solved example score otherwise
# (WinoGrande's short sentences: the example stays inside the window);
# examples from another file too; a count of --fewshot-from files that does
# not match --choices is named.
eval(shot --choices ${WINOGRANDE} --fewshot 1 --json --predictions ${WORK}/shot.jsonl)
string(JSON shot_q GET "${shot}" choices ${WINOGRANDE} questions)
file(STRINGS ${WORK}/shot.jsonl shot_rows)
list(GET shot_rows 0 shot_first)
list(GET wino_rows 0 plain_first)
string(JSON shot_nll GET "${shot_first}" nll 0)
string(JSON plain_nll GET "${plain_first}" nll 0)
if(NOT shot_q EQUAL 4 OR shot_nll STREQUAL plain_nll)
  message(FATAL_ERROR "--fewshot 2: ${shot_q} questions, first score ${shot_nll} (zero-shot "
                      "${plain_nll})")
endif()
eval(other --choices ${QUESTIONS} --fewshot 3 --fewshot-from ${WINOGRANDE} --json)
execute_process(COMMAND ${EVAL} --run ${RUN} --choices ${QUESTIONS} --choices ${QUESTIONS}
                        --fewshot 1 --fewshot-from ${WINOGRANDE}
                RESULT_VARIABLE rc OUTPUT_VARIABLE o ERROR_VARIABLE e)
if(rc EQUAL 0 OR NOT e MATCHES "--fewshot-from names 1 file\\(s\\) for 2 --choices file\\(s\\)")
  message(FATAL_ERROR "a --fewshot-from per --choices file: exit ${rc}, ${e}")
endif()
execute_process(COMMAND ${EVAL} --run ${RUN} --choices ${WINOGRANDE} --fewshot 4
                RESULT_VARIABLE rc OUTPUT_VARIABLE o ERROR_VARIABLE e)
if(rc EQUAL 0 OR NOT e MATCHES "question 1 has 3 example\\(s\\) to show, 4 asked")
  message(FATAL_ERROR "more examples than the file holds: exit ${rc}, ${e}")
endif()

# LAMBADA: each text's last word scored after the rest; the accuracy is the
# share of words greedy decoding writes, the perplexity exp of the mean
# word -log p, both as the predictions file's lines say.
set(LAMBADA ${CMAKE_CURRENT_LIST_DIR}/../data/fixtures/lambada_texts.jsonl)
eval(lam --lambada ${LAMBADA} --json --predictions ${WORK}/lambada.jsonl)
string(JSON lam_n GET "${lam}" lambada ${LAMBADA} texts)
string(JSON lam_acc GET "${lam}" lambada ${LAMBADA} acc)
string(JSON lam_ppl GET "${lam}" lambada ${LAMBADA} perplexity)
file(STRINGS ${WORK}/lambada.jsonl lam_rows)
list(LENGTH lam_rows lam_rows_n)
if(NOT lam_n EQUAL 5 OR NOT lam_rows_n EQUAL 5)
  message(FATAL_ERROR "LAMBADA: ${lam_n} texts, ${lam_rows_n} prediction lines, not 5")
endif()
set(greedy 0)
foreach(row IN LISTS lam_rows)
  string(JSON g GET "${row}" greedy)
  if(g)
    math(EXPR greedy "${greedy} + 1")
  endif()
endforeach()
millionths("${lam_acc}" got)
math(EXPR want "${greedy} * 1000000 / 5")
if(NOT got EQUAL want)
  message(FATAL_ERROR "LAMBADA: acc ${lam_acc}, but ${greedy} of 5 words are greedy")
endif()
message(STATUS "LAMBADA: acc ${lam_acc}, perplexity ${lam_ppl}")

# MMLU's lines: each subject's accuracy and the mean over subjects beside the
# mean over questions; 2-shot prompts from the file's own questions of the
# same subject.
set(MMLU ${CMAKE_CURRENT_LIST_DIR}/../data/fixtures/mmlu_questions.jsonl)
eval(mmlu --choices ${MMLU} --fewshot 2 --json --predictions ${WORK}/mmlu.jsonl)
string(JSON mmlu_q GET "${mmlu}" choices ${MMLU} questions)
string(JSON mmlu_mean GET "${mmlu}" choices ${MMLU} acc_group_mean)
string(JSON math_q GET "${mmlu}" choices ${MMLU} groups elementary_mathematics questions)
string(JSON math_acc GET "${mmlu}" choices ${MMLU} groups elementary_mathematics acc)
string(JSON astro_acc GET "${mmlu}" choices ${MMLU} groups astronomy acc)
if(NOT mmlu_q EQUAL 7 OR NOT math_q EQUAL 4)
  message(FATAL_ERROR "MMLU: ${mmlu_q} questions, ${math_q} of elementary mathematics")
endif()
millionths("${math_acc}" m)
millionths("${astro_acc}" a)
millionths("${mmlu_mean}" mean)
math(EXPR want "(${m} + ${a}) / 2")
math(EXPR diff "${mean} - ${want}")
if(diff GREATER 1 OR diff LESS -1)
  message(FATAL_ERROR "MMLU: mean over subjects ${mmlu_mean}, subjects ${math_acc} and ${astro_acc}")
endif()
# Each subject's acc is its questions' share of right picks.
file(STRINGS ${WORK}/mmlu.jsonl mmlu_rows)
set(right 0)
foreach(i 0 1 2 3)
  list(GET mmlu_rows ${i} row)
  string(JSON p GET "${row}" pick)
  string(JSON a GET "${row}" answer)
  if(p EQUAL a)
    math(EXPR right "${right} + 1")
  endif()
endforeach()
math(EXPR want "${right} * 1000000 / 4")
math(EXPR diff "${m} - ${want}")
if(diff GREATER 1 OR diff LESS -1)
  message(FATAL_ERROR "MMLU: elementary mathematics acc ${math_acc}, ${right} of 4 right")
endif()

# HellaSwag in lm-evaluation-harness's prompt: another context (the
# activity label first), so other scores; the same questions and answers.
eval(harness --choices ${QUESTIONS} --hellaswag-prompt harness --json
     --predictions ${WORK}/harness.jsonl)
string(JSON harness_q GET "${harness}" choices ${QUESTIONS} questions)
file(STRINGS ${WORK}/harness.jsonl harness_rows)
list(GET harness_rows 0 harness_first)
list(GET rows 0 raw_first)
string(JSON harness_nll GET "${harness_first}" nll 0)
string(JSON raw_nll GET "${raw_first}" nll 0)
string(JSON harness_answer GET "${harness_first}" answer)
string(JSON raw_answer GET "${raw_first}" answer)
if(NOT harness_q EQUAL n OR harness_nll STREQUAL raw_nll OR NOT harness_answer EQUAL raw_answer)
  message(FATAL_ERROR "--hellaswag-prompt harness: ${harness_q} questions, first choice "
                      "${harness_nll} (raw ${raw_nll}), answer ${harness_answer} (${raw_answer})")
endif()
