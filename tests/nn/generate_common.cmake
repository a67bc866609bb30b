# Helpers of the triad-generate scripts that ask the chat fixture's model
# with its tokenizer directory copied to ${WORK}/model, where a script
# writes a generation_config.json (included with -P scripts).
# Variables: GENERATE (triad-generate), FIXTURE (the chat model's tokenizer
# directory), WORK; the including script sets `args`.
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK}/model)
file(COPY ${FIXTURE}/tokenizer.json ${FIXTURE}/tokenizer_config.json DESTINATION ${WORK}/model)

# triad-generate with `args` and ARGN: stdout in `out`, stderr in `err`; a
# non-zero exit fails the test.
function(generate out err)
  execute_process(COMMAND ${GENERATE} ${args} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE o
                  ERROR_VARIABLE e)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "triad-generate ${ARGN} exited ${rc}: ${o}${e}")
  endif()
  set(${out} "${o}" PARENT_SCOPE)
  set(${err} "${e}" PARENT_SCOPE)
endfunction()
