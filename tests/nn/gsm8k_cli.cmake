# triad-eval --gsm8k end to end: a model made to write "7" and nothing else
# (tests/nn/constant_reply_model.py on the tiny model's weights) gets the
# two problems whose answer is 7 right by the flexible extraction when it
# may write one token, none when it may write four ("7777"), none by the
# strict one ("#### " never written); a stop string ends generation; the
# rates are the share of the --predictions lines marked right; few-shot
# prompts, batches and the bad options are checked too.
# Variables: EVAL (triad-eval), PYTHON, SCRIPT (constant_reply_model.py),
# CHECKER (harness_gsm8k_prompts.py), RUN (a triad-train output.dir of the
# byte-level tiny model), PROBLEMS, WORK.
include(${CMAKE_CURRENT_LIST_DIR}/eval_common.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/../train/e2e_common.cmake)
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
run("making the model that writes 7" ${PYTHON} ${SCRIPT} ${RUN}/model.safetensors
    ${WORK}/seven.safetensors 55)
set(model --config ${RUN}/config.yaml --weights ${WORK}/seven.safetensors --gsm8k ${PROBLEMS})

# expect(LABEL STRICT FLEXIBLE TOKENS ARGS...): the JSON report's rates
# (within a millionth) and tokens generated, and the predictions agreeing.
function(expect label strict flexible tokens)
  run_for_stdout("${label}" report ${EVAL} ${model} --json --predictions ${WORK}/p.jsonl ${ARGN})
  string(JSON s GET "${report}" gsm8k ${PROBLEMS} exact_match_strict)
  string(JSON f GET "${report}" gsm8k ${PROBLEMS} exact_match_flexible)
  string(JSON t GET "${report}" gsm8k ${PROBLEMS} generated_tokens)
  string(JSON n GET "${report}" gsm8k ${PROBLEMS} problems)
  expect_within("${s}" "${strict}" 1 "${label}: exact_match_strict")
  expect_within("${f}" "${flexible}" 1 "${label}: exact_match_flexible")
  if(NOT t EQUAL tokens OR NOT n EQUAL 3)
    message(FATAL_ERROR "${label}: got ${report}, expected ${tokens} tokens, 3 problems")
  endif()
  file(STRINGS ${WORK}/p.jsonl rows)
  set(right 0)
  foreach(row IN LISTS rows)
    string(JSON ok GET "${row}" flexible_right)
    string(JSON x GET "${row}" flexible)
    string(JSON i GET "${row}" index)
    if(ok)
      math(EXPR right "${right} + 1")
      if(NOT x STREQUAL "7" OR i EQUAL 1)
        message(FATAL_ERROR "${label}: problem ${i} marked right with '${x}'")
      endif()
    endif()
  endforeach()
  set(${label}_right ${right} PARENT_SCOPE)
endfunction()

expect(one_token 0 0.666666 3 --gen-tokens 1)
if(NOT one_token_right EQUAL 2)
  message(FATAL_ERROR "${one_token_right} predictions marked right, the report says 2 of 3")
endif()
# Batches of one and a few-shot prompt (the first other problems) change
# nothing a constant reply depends on.
expect(batched 0 0.666666 3 --gen-tokens 1 --batch 1 --fewshot 2)
expect(four_tokens 0 0 12 --gen-tokens 4)
# --limit 1 asks one problem, its two examples taken from past the limit.
run_for_stdout("limit with shots" limited ${EVAL} ${model} --json --gen-tokens 1 --limit 1
               --fewshot 2)
string(JSON n GET "${limited}" gsm8k ${PROBLEMS} problems)
string(JSON f GET "${limited}" gsm8k ${PROBLEMS} exact_match_flexible)
if(NOT n EQUAL 1)
  message(FATAL_ERROR "--limit 1 --fewshot 2 asked ${n} problems: ${limited}")
endif()
expect_within("${f}" "1" 1 "--limit 1: the first problem's answer is 7")
# "77" ends generation after two tokens, and the reply before it is empty.
expect(stopped 0 0 6 --gen-tokens 10 --stop 77)
file(STRINGS ${WORK}/p.jsonl rows)
list(GET rows 0 row)
string(JSON reply GET "${row}" reply)
string(JSON x GET "${row}" flexible)
if(NOT reply STREQUAL "" OR NOT x STREQUAL "[invalid]")
  message(FATAL_ERROR "the reply cut at the stop string reads '${reply}' ('${x}')")
endif()

# A reply cut inside a character (the first byte of 你, 0xE4, and nothing
# after it) is written to --predictions with U+FFFD in its place.
run("making the model that writes 0xE4" ${PYTHON} ${SCRIPT} ${RUN}/model.safetensors
    ${WORK}/e4.safetensors 228)
run_for_stdout("a cut character" report ${EVAL} --config ${RUN}/config.yaml --weights
               ${WORK}/e4.safetensors --gsm8k ${PROBLEMS} --gen-tokens 1 --predictions
               ${WORK}/cut.jsonl)
run_for_stdout("reading the cut character" reply ${PYTHON} -c
               "print(ascii(__import__('json').loads(open('${WORK}/cut.jsonl').readline())['reply']))")
if(NOT reply STREQUAL "'\\ufffd'\n")
  message(FATAL_ERROR "the cut character was written as ${reply}")
endif()

# --fewshot-seed: the prompts lm-evaluation-harness builds, each problem's
# examples drawn in turn by Python's random.Random(SEED) (written out by
# harness_gsm8k_prompts.py to compare): from the file itself, one more drawn
# than shown and the problem asked dropped; from a train file of 40, two.
run_for_stdout("drawn shots" drawn ${EVAL} ${model} --json --gen-tokens 1 --fewshot 2
               --fewshot-seed 1234 --predictions ${WORK}/drawn.jsonl)
string(JSON seed GET "${drawn}" gsm8k ${PROBLEMS} fewshot_seed)
string(JSON f GET "${drawn}" gsm8k ${PROBLEMS} exact_match_flexible)
if(NOT seed EQUAL 1234)
  message(FATAL_ERROR "the report names fewshot_seed ${seed}: ${drawn}")
endif()
expect_within("${f}" "0.666666" 1 "--fewshot-seed: a constant reply scores the same")
run("the drawn prompts are the harness's" ${PYTHON} ${CHECKER} ${PROBLEMS} ${WORK}/drawn.jsonl 2
    --seed 1234)
set(train "")
foreach(k RANGE 1 40)
  string(APPEND train "{\"question\": \"What is ${k} + 1?\", \"answer\": \"${k} + 1 = ")
  math(EXPR sum "${k} + 1")
  string(APPEND train "${sum}\\n#### ${sum}\"}\n")
endforeach()
file(WRITE ${WORK}/train.jsonl "${train}")
foreach(seed 1234 7)
  run("drawing from train (seed ${seed})" ${EVAL} ${model} --gen-tokens 1 --fewshot 2
      --fewshot-seed ${seed} --gsm8k-fewshot-from ${WORK}/train.jsonl --predictions
      ${WORK}/drawn_train.jsonl)
  run("the prompts drawn from train are the harness's (seed ${seed})" ${PYTHON} ${CHECKER}
      ${PROBLEMS} ${WORK}/drawn_train.jsonl 2 --seed ${seed} --pool ${WORK}/train.jsonl)
endforeach()
# A first-N prompt is not what the harness draws (and is what the checker
# takes without a seed).
run("first shots" ${EVAL} ${model} --gen-tokens 1 --fewshot 2 --gsm8k-fewshot-from
    ${WORK}/train.jsonl --predictions ${WORK}/first.jsonl)
run("the first prompts" ${PYTHON} ${CHECKER} ${PROBLEMS} ${WORK}/first.jsonl 2 --pool
    ${WORK}/train.jsonl)
execute_process(COMMAND ${PYTHON} ${CHECKER} ${PROBLEMS} ${WORK}/first.jsonl 2 --seed 1234
                        --pool ${WORK}/train.jsonl RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
if(rc EQUAL 0)
  message(FATAL_ERROR "the checker passed prompts of the first two train problems")
endif()

# Bad options are named.
run_expecting_error(fewshot "3 few-shot examples asked for, but only 2 other problem" ${EVAL}
                    ${model} --fewshot 3)
run_expecting_error(fewshot_seed "--fewshot-seed needs --fewshot N" ${EVAL} ${model}
                    --fewshot-seed 1)
run_expecting_error(negative_seed "--fewshot-seed -2 must be >= 0" ${EVAL} ${model} --fewshot 1
                    --fewshot-seed -2)
run_expecting_error(gen_tokens "--gen-tokens 128 must be below the model's seq_len [(]128[)]"
                    ${EVAL} ${model} --gen-tokens 128)
run_expecting_error(fewshot_from "--gsm8k-fewshot-from needs --gsm8k" ${EVAL} --config
                    ${RUN}/config.yaml --weights ${WORK}/seven.safetensors --text ${PROBLEMS}
                    --gsm8k-fewshot-from ${PROBLEMS})
