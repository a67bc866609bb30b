# triad-eval --gsm8k --chat-template: each problem asked as
# lm-evaluation-harness asks a chat model (--apply_chat_template, with and
# without --fewshot_as_multiturn and --system_instruction), its prompt
# (--predictions' "prompt") checked against harness_gsm8k_prompts.py's, for
# a built-in template and for the model's own Jinja program alike; the
# report names the template; the options that need another are named.
# Variables: EVAL (triad-eval), PYTHON, CHECKER (harness_gsm8k_prompts.py),
# CHAT_RUN (the chat fixture model's output.dir), FIXTURE (its tokenizer
# directory), PROBLEMS, WORK.
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

run_expecting_error(multiturn "--fewshot-as-multiturn needs --chat-template" ${EVAL} ${model}
                    --fewshot 1 --fewshot-as-multiturn)
run_expecting_error(system "--system-instruction needs --chat-template" ${EVAL} ${model}
                    --system-instruction x)
run_expecting_error(no_gsm8k "--chat-template asks --gsm8k's problems as a chat" ${EVAL} --run
                    ${CHAT_RUN} --tokenizer ${FIXTURE} --text ${PROBLEMS} --chat-template chatml)
run_expecting_error(bos "--bos-token with --chat-template" ${EVAL} ${model} --chat-template
                    chatml --bos-token <|im_start|>)
