# Each rank's timing in metrics.jsonl (rank_timing, at log.interval's
# steps) on a pipeline of two ranks whose stages do unequal work: rank 0
# holds five of the six blocks, rank 1 one block and the head over a
# vocabulary of 256. Rank 0's compute is the slowest, rank 1 waits for it
# (its p2p time is the larger), and every category has its fastest,
# mean and slowest rank; the console has a line for each rank. Rank 0's
# five blocks also hold the most memory (rank_peak_memory). A rank is a
# straggler only against the ranks of its own stage: with a
# log.straggler_factor just over 1, neither stage (one rank each) has one,
# while of two data-parallel ranks (one stage) the slower is named.
#   -DTRAIN= -DMPIRUN= -DCONFIG= -DDATA= -DWORK=
include(${CMAKE_CURRENT_LIST_DIR}/e2e_common.cmake)
file(REMOVE_RECURSE ${WORK})
set(common ${TRAIN} --config ${CONFIG} --set data.train=${DATA} --set model.n_layer=6
    --set train.steps=4 --set log.interval=2 --set log.straggler_factor=1.000001)
run(training ${MPIRUN} -np 2 ${common} --set parallel.pp=2 --set parallel.stage_layers=[5,1]
    --set output.dir=${WORK})
file(STRINGS ${WORK}/metrics.jsonl lines)
list(LENGTH lines count)
if(NOT count EQUAL 4)
  message(FATAL_ERROR "metrics.jsonl has ${count} lines, not 4:\n${lines}")
endif()
list(GET lines 0 first)
string(JSON has ERROR_VARIABLE none GET "${first}" rank_timing)
if(NOT none)
  message(FATAL_ERROR "step 1 is not a log.interval step but has rank_timing:\n${first}")
endif()
foreach(index 1 3)
  list(GET lines ${index} line)
  foreach(category forward backward weight-grad p2p dp optimizer compute)
    foreach(key min_ms mean_ms max_ms slowest_rank)
      string(JSON ${key} GET "${line}" rank_timing ${category} ${key})
    endforeach()
    if(min_ms GREATER mean_ms OR mean_ms GREATER max_ms OR slowest_rank LESS 0
       OR slowest_rank GREATER 1)
      message(FATAL_ERROR "rank_timing.${category} of step line ${index}: min ${min_ms}, mean "
                          "${mean_ms}, max ${max_ms}, slowest rank ${slowest_rank}")
    endif()
  endforeach()
  string(JSON slowest GET "${line}" rank_timing compute slowest_rank)
  string(JSON fast GET "${line}" rank_timing compute min_ms)
  string(JSON slow GET "${line}" rank_timing compute max_ms)
  if(NOT slowest EQUAL 0 OR NOT slow GREATER fast)
    message(FATAL_ERROR "five blocks on rank 0, one on rank 1: the slowest compute is rank "
                        "${slowest}'s (${slow} ms a step against ${fast}), expected rank 0's:\n${line}")
  endif()
  string(JSON largest GET "${line}" rank_peak_memory largest_rank)
  string(JSON most GET "${line}" rank_peak_memory max_bytes)
  string(JSON least GET "${line}" rank_peak_memory min_bytes)
  if(NOT largest EQUAL 0 OR NOT most GREATER least)
    message(FATAL_ERROR "five blocks on rank 0, one on rank 1: rank ${largest} held the most "
                        "(${most} bytes against ${least}), expected rank 0:\n${line}")
  endif()
  string(JSON waits GET "${line}" rank_timing p2p slowest_rank)
  if(NOT waits EQUAL 1)
    message(FATAL_ERROR "rank 1 waits for rank 0's five blocks, but rank ${waits} waited longest:\n${line}")
  endif()
endforeach()
foreach(rank 0 1)
  if(NOT run_output MATCHES "rank +${rank} ms/step: forward [^\n]* [|] peak [0-9.e-]+ GB")
    message(FATAL_ERROR "no timing line for rank ${rank}:\n${run_output}")
  endif()
endforeach()
if(run_output MATCHES "is a straggler" OR lines MATCHES "stragglers")
  message(FATAL_ERROR "two stages of one rank each have no stragglers:\n${run_output}")
endif()

run(data-parallel ${MPIRUN} -np 2 ${common} --set output.dir=${WORK}/dp)
file(STRINGS ${WORK}/dp/metrics.jsonl lines)
foreach(index 1 3)
  list(GET lines ${index} line)
  string(JSON slowest GET "${line}" rank_timing compute slowest_rank)
  string(JSON count LENGTH "${line}" stragglers)
  string(JSON rank GET "${line}" stragglers 0 rank)
  string(JSON peers GET "${line}" stragglers 0 peers)
  if(NOT count EQUAL 1 OR NOT rank EQUAL slowest OR NOT peers EQUAL 2)
    message(FATAL_ERROR "of two data-parallel ranks the slower (${slowest}) is the straggler, "
                        "of 2 peers:\n${line}")
  endif()
endforeach()
if(NOT run_output MATCHES "rank [01] \\(node 0\\) is a straggler: [0-9.]+ ms of compute a step")
  message(FATAL_ERROR "no straggler warning:\n${run_output}")
endif()
