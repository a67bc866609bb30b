# triad-eval --chat-template: each GSM8K problem and each MMLU question
# asked as lm-evaluation-harness asks a chat model (--apply_chat_template,
# with and without --fewshot_as_multiturn and --system_instruction), its
# prompt (--predictions' "prompt" or "context") checked against
# harness_gsm8k_prompts.py's and harness_choice_chats.py's, for a built-in
# template and for the model's own Jinja program alike; the report names
# the template; the options that need another are named.
# Variables: EVAL (triad-eval), PYTHON, CHECKER (harness_gsm8k_prompts.py),
# CHOICE_CHECKER (harness_choice_chats.py), CHAT_RUN (the chat fixture
# model's output.dir), FIXTURE (its tokenizer directory), PROBLEMS, MMLU,
# WINOGRANDE, WORK.
include(${CMAKE_CURRENT_LIST_DIR}/eval_common.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/../train/e2e_common.cmake)
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
set(model --run ${CHAT_RUN} --tokenizer ${FIXTURE} --gsm8k ${PROBLEMS} --gen-tokens 3)

# A one-turn conversation: the few-shot prompt as the user's message.
run_for_stdout("one user turn" report ${EVAL} ${model} --chat-template chatml --fewshot 1 --json
               --predictions ${WORK}/one.jsonl)
string(JSON name GET "${report}" gsm8k ${PROBLEMS} chat_template)
string(JSON turns GET "${report}" gsm8k ${PROBLEMS} fewshot_as_multiturn)
string(JSON cut GET "${report}" gsm8k ${PROBLEMS} truncated_prompts)
if(NOT name STREQUAL "chatml" OR turns OR NOT cut EQUAL 3)
  message(FATAL_ERROR "the report does not say how the problems were asked: ${report}")
endif()
run("one user turn: the harness's prompts" ${PYTHON} ${CHECKER} ${PROBLEMS} ${WORK}/one.jsonl 1
    --chat)
# Each example a turn of its own, after a system message; the model's own
# template (the fixture's Jinja program) and `auto` write the same.
foreach(template chatml auto model)
  run("multiturn (${template})" ${EVAL} ${model} --chat-template ${template} --fewshot 2
      --fewshot-seed 1234 --fewshot-as-multiturn --system-instruction "Solve it."
      --predictions ${WORK}/multi_${template}.jsonl)
  run("multiturn (${template}): the harness's prompts" ${PYTHON} ${CHECKER} ${PROBLEMS}
      ${WORK}/multi_${template}.jsonl 2 --seed 1234 --chat --multiturn --system "Solve it.")
endforeach()
# Zero-shot: the question alone as the user's message.
run("zero-shot" ${EVAL} ${model} --chat-template chatml --predictions ${WORK}/zero.jsonl)
run("zero-shot: the harness's prompts" ${PYTHON} ${CHECKER} ${PROBLEMS} ${WORK}/zero.jsonl 0
    --chat)
# The checker tells the two forms apart.
execute_process(COMMAND ${PYTHON} ${CHECKER} ${PROBLEMS} ${WORK}/one.jsonl 1 --chat --multiturn
                RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
if(rc EQUAL 0)
  message(FATAL_ERROR "the checker passed one user turn as a multiturn conversation")
endif()

# MMLU: the description a system message, the examples the subject's
# first; the choices scored as the assistant's answer.
foreach(turns one multi)
  set(flag "")
  set(check_flag "")
  if(turns STREQUAL "multi")
    set(flag --fewshot-as-multiturn)
    set(check_flag --multiturn)
  endif()
  run_for_stdout("MMLU (${turns})" report ${EVAL} --run ${CHAT_RUN} --tokenizer ${FIXTURE}
                 --choices ${MMLU} --fewshot 1 --chat-template model ${flag}
                 --system-instruction "Answer." --json --predictions ${WORK}/mmlu_${turns}.jsonl)
  string(JSON name GET "${report}" choices ${MMLU} chat_template)
  string(JSON n GET "${report}" choices ${MMLU} questions)
  if(NOT name MATCHES "^model$" OR NOT n EQUAL 7)
    message(FATAL_ERROR "MMLU (${turns}): ${report}")
  endif()
  run("MMLU (${turns}): the harness's conversations" ${PYTHON} ${CHOICE_CHECKER} ${MMLU}
      ${WORK}/mmlu_${turns}.jsonl 1 ${check_flag} --system "Answer.")
endforeach()
execute_process(COMMAND ${PYTHON} ${CHOICE_CHECKER} ${MMLU} ${WORK}/mmlu_one.jsonl 1
                        --multiturn --system "Answer." RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
if(rc EQUAL 0)
  message(FATAL_ERROR "the choice checker passed one user turn as a multiturn conversation")
endif()
# A chat scores other numbers than the plain prompt does.
run_for_stdout("MMLU plain" plain ${EVAL} --run ${CHAT_RUN} --tokenizer ${FIXTURE} --choices ${MMLU}
               --fewshot 1 --json --predictions ${WORK}/mmlu_plain.jsonl)
file(STRINGS ${WORK}/mmlu_plain.jsonl plain_rows)
file(STRINGS ${WORK}/mmlu_multi.jsonl chat_rows)
list(GET plain_rows 0 plain_row)
list(GET chat_rows 0 chat_row)
string(JSON plain_nll GET "${plain_row}" nll 0)
string(JSON chat_nll GET "${chat_row}" nll 0)
if(plain_nll STREQUAL chat_nll)
  message(FATAL_ERROR "the chat and the plain prompt score choice A alike (${plain_nll})")
endif()
run_expecting_error(winogrande "a question with a context per choice [(]WinoGrande's[)] is not asked"
                    ${EVAL} --run ${CHAT_RUN} --tokenizer ${FIXTURE} --choices ${WINOGRANDE}
                    --chat-template chatml)

run_expecting_error(multiturn "--fewshot-as-multiturn needs --chat-template" ${EVAL} ${model}
                    --fewshot 1 --fewshot-as-multiturn)
run_expecting_error(system "--system-instruction needs --chat-template" ${EVAL} ${model}
                    --system-instruction x)
run_expecting_error(no_gsm8k "--chat-template asks --gsm8k's problems and --choices' questions" ${EVAL} --run
                    ${CHAT_RUN} --tokenizer ${FIXTURE} --text ${PROBLEMS} --chat-template chatml)
run_expecting_error(bos "--bos-token with --chat-template" ${EVAL} ${model} --chat-template
                    chatml --bos-token <|im_start|>)
