# Each rank checks its part of the token data against the vocabulary (the
# job reads the data once at start-up, not once per rank), and the ranks
# agree on the first bad token before any stops: a token only the last
# rank's part holds stops the job with the error one process gives, naming
# the file, the token and its position, before the first step.
# Variables: TRAIN (triad-train), TOKENIZE (triad-tokenize), MPIRUN (list),
# CONFIG, DATA (a byte-level shard of ASCII text), WORK.
include(${CMAKE_CURRENT_LIST_DIR}/e2e_common.cmake)
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK}/data)
# The stream: the tiny shard, then a shard whose first byte (0xC3, of "é")
# is above a vocabulary of 128: in the second half of the stream.
file(COPY_FILE ${DATA} ${WORK}/data/a.bin)
file(WRITE ${WORK}/b.txt "été au bord de la mer\n")
run(tokenize ${TOKENIZE} --input ${WORK}/b.txt --output ${WORK}/data/b.bin)
set(common --config ${CONFIG} "--set" "data.train=${WORK}/data/*.bin" --set model.vocab_size=128
    --set train.steps=1 --set log.interval=1 --set data.val=null --set eval.interval=0
    --set eval.batches=0)
set(expected "token data '${WORK}/data/b.bin': token 195 at position 0 is not in [0, vocab_size 128)")

execute_process(COMMAND ${TRAIN} ${common} --set output.dir=${WORK}/one
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out TIMEOUT 120)
string(FIND "${out}" "${expected}" at)
if(rc EQUAL 0 OR at EQUAL -1)
  message(FATAL_ERROR "one process: expected '${expected}', got ${rc}:\n${out}")
endif()
foreach(layout "parallel.dp=2" "parallel.pp=2")
  execute_process(COMMAND ${MPIRUN} -np 2 ${TRAIN} ${common} --set ${layout}
                          --set output.dir=${WORK}/two
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out TIMEOUT 120)
  string(FIND "${out}" "${expected}" at)
  if(rc EQUAL 0 OR rc MATCHES "timeout" OR at EQUAL -1)
    message(FATAL_ERROR "two ranks (${layout}): expected '${expected}', got ${rc}:\n${out}")
  endif()
  if(out MATCHES "step +1/1")
    message(FATAL_ERROR "two ranks (${layout}): a step ran before the error:\n${out}")
  endif()
endforeach()
message(STATUS "one process and two ranks name the same token")
