# triad-generate stops at every id of a generation_config.json's
# eos_token_id beside --tokenizer (as transformers' generate() does), besides
# the model's own end token; --stop-token, when given, replaces them all.
# Variables: GENERATE (triad-generate), CHAT_RUN (a chat model's output.dir),
# FIXTURE (the chat model's tokenizer directory), WORK.
include(${CMAKE_CURRENT_LIST_DIR}/generate_common.cmake)
set(args --run ${CHAT_RUN} --chat-template model --tokenizer ${WORK}/model --prompt "1+2"
    --tokens 12 --temperature 0.8 --seed 5 --no-stream)

# Without the file: the reply up to the model's eos_token, <|im_end|>.
generate(plain plain_err)
if(plain STREQUAL "\n")
  message(FATAL_ERROR "the chat model's reply is empty: the test needs one")
endif()
if(plain_err MATCHES "stop tokens:")
  message(FATAL_ERROR "stop tokens named without a generation_config.json: ${plain_err}")
endif()

# Every id the model can produce is an end: the reply stops at its first
# token and prints nothing.
set(ids "")
foreach(id RANGE 0 259)
  string(APPEND ids "${id}, ")
endforeach()
file(WRITE ${WORK}/model/generation_config.json
     "{\"bos_token_id\": 301, \"eos_token_id\": [${ids}300, 301, 302]}")
generate(ended ended_err)
if(NOT ended STREQUAL "\n")
  message(FATAL_ERROR "with every id an end the reply is [${ended}], not empty")
endif()
if(NOT ended_err MATCHES "stop tokens: <\\|im_end\\|> \\(302\\), 0, 1, 2, .*259, <\\|endoftext\\|> \\(300\\), <\\|im_start\\|> \\(301\\) \\(with generation_config.json's eos_token_id\\)")
  message(FATAL_ERROR "the stop tokens are not logged as expected: ${ended_err}")
endif()

# --stop-token replaces them: the reply is the one without the file.
generate(given given_err --stop-token 302)
if(NOT given STREQUAL plain)
  message(FATAL_ERROR "--stop-token 302 gives [${given}], without the file [${plain}]")
endif()

# An id the tokenizer lacks is an error naming the file's key.
file(WRITE ${WORK}/model/generation_config.json "{\"eos_token_id\": [302, 5000]}")
execute_process(COMMAND ${GENERATE} ${args} RESULT_VARIABLE rc OUTPUT_VARIABLE o ERROR_VARIABLE e)
if(rc EQUAL 0 OR NOT e MATCHES "generation_config.json's eos_token_id 5000 is outside the tokenizer's vocabulary \\[0, 303\\)")
  message(FATAL_ERROR "an id outside the vocabulary: exit ${rc}, ${e}")
endif()
message(STATUS "reply without the file: ${plain}")
