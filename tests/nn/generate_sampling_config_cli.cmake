# triad-generate chooses tokens as a generation_config.json beside
# --tokenizer tells transformers' generate() to: greedily unless do_sample
# is true, else at its temperature, top_k, top_p (transformers' defaults for
# what it leaves out) and repetition_penalty; a flag overrides its setting,
# and --ignore-generation-config all of them.
# Variables: GENERATE (triad-generate), CHAT_RUN (a chat model's output.dir),
# FIXTURE (the chat model's tokenizer directory), WORK.
include(${CMAKE_CURRENT_LIST_DIR}/generate_common.cmake)
set(args --run ${CHAT_RUN} --chat-template model --tokenizer ${WORK}/model --prompt "1+2"
    --tokens 16 --seed 5 --no-stream --stop-token -1)
function(expect_same what a b)
  if(NOT "${a}" STREQUAL "${b}")
    message(FATAL_ERROR "${what}: [${a}] and [${b}] differ")
  endif()
endfunction()

# No file: triad-generate's own defaults, nothing logged about sampling.
generate(greedy greedy_err --temperature 0)
generate(sampled sampled_err --temperature 0.7 --top-k 20 --top-p 0.8 --repetition-penalty 1.05)
if(greedy STREQUAL sampled)
  message(FATAL_ERROR "greedy and sampled replies are the same [${greedy}]: the test needs two")
endif()
if(sampled_err MATCHES "sampling as")
  message(FATAL_ERROR "sampling settings logged without a generation_config.json: ${sampled_err}")
endif()

# A file of token ids alone says nothing about sampling: the defaults stay.
generate(defaults defaults_err)
file(WRITE ${WORK}/model/generation_config.json "{\"bos_token_id\": 301, \"pad_token_id\": 0}")
generate(ids_only ids_only_err)
expect_same("a file without sampling settings" "${ids_only}" "${defaults}")

# do_sample false, or absent with settings written (transformers warns and
# decodes greedily): greedy.
file(WRITE ${WORK}/model/generation_config.json "{\"do_sample\": false, \"top_p\": 0.5}")
generate(file_greedy file_greedy_err)
expect_same("do_sample false" "${file_greedy}" "${greedy}")
if(NOT file_greedy_err MATCHES "sampling as [^\n]*generation_config.json says \\(greedy: no do_sample true\\): temperature 0, repetition_penalty 1 \\(flags override")
  message(FATAL_ERROR "greedy decoding is not logged as expected: ${file_greedy_err}")
endif()
file(WRITE ${WORK}/model/generation_config.json "{\"temperature\": 0.7}")
generate(no_do_sample no_do_sample_err)
expect_same("settings without do_sample" "${no_do_sample}" "${greedy}")

# Qwen2.5 Instruct's kind of file: its settings, as the flags give them.
file(WRITE ${WORK}/model/generation_config.json
     "{\"do_sample\": true, \"temperature\": 0.7, \"top_p\": 0.8, \"top_k\": 20, \"repetition_penalty\": 1.05}")
generate(file_sampled file_sampled_err)
expect_same("do_sample true" "${file_sampled}" "${sampled}")
if(NOT file_sampled_err MATCHES "\\(do_sample true\\): temperature 0.7, top_k 20, top_p 0.8, min_p 0, repetition_penalty 1.05")
  message(FATAL_ERROR "the file's settings are not logged as expected: ${file_sampled_err}")
endif()
# Flags override the file setting by setting; --ignore-generation-config
# takes none of it.
generate(overridden overridden_err --temperature 0)
generate(greedy_penalised greedy_penalised_err --temperature 0 --repetition-penalty 1.05
         --ignore-generation-config)
expect_same("--temperature 0 over the file" "${overridden}" "${greedy_penalised}")
generate(ignored ignored_err --ignore-generation-config)
expect_same("--ignore-generation-config" "${ignored}" "${defaults}")
if(ignored_err MATCHES "sampling as")
  message(FATAL_ERROR "--ignore-generation-config still logs the file's sampling: ${ignored_err}")
endif()
# transformers' defaults for what do_sample true leaves out: top_k 50, top_p 1.
file(WRITE ${WORK}/model/generation_config.json "{\"do_sample\": true, \"temperature\": 0.7}")
generate(file_defaults file_defaults_err)
generate(flag_defaults flag_defaults_err --temperature 0.7 --top-k 50 --top-p 1 --ignore-generation-config)
expect_same("transformers' defaults" "${file_defaults}" "${flag_defaults}")

# A setting out of its range is an error naming the file, key and value.
file(WRITE ${WORK}/model/generation_config.json "{\"do_sample\": true, \"top_p\": 1.5}")
execute_process(COMMAND ${GENERATE} ${args} RESULT_VARIABLE rc OUTPUT_VARIABLE o ERROR_VARIABLE e)
if(rc EQUAL 0 OR NOT e MATCHES "generation_config.json': top_p \\(1.5\\) must be a number in \\(0, 1\\]")
  message(FATAL_ERROR "top_p 1.5: exit ${rc}, ${e}")
endif()
message(STATUS "greedy reply: ${greedy}; sampled: ${sampled}")
