# Every pipeline schedule of one chunk per rank (gpipe, 1f1b, zb-h1, zb-auto)
# runs each stage's forwards, input gradients and weight gradients in
# microbatch order, so the weight gradients add up in the same order and the
# runs are bit-identical: the same loss and gradient norm at every step, to
# the last digit. zb-auto re-plans after step 2 from measured times, which
# must change its order but not one number.
# Variables: TRAIN (triad-train), MPIRUN (list), CONFIG, DATA, WORK.
include(${CMAKE_CURRENT_LIST_DIR}/e2e_common.cmake)
file(REMOVE_RECURSE ${WORK})
set(common --config ${CONFIG} --set data.train=${DATA} --set model.n_layer=4 --set train.steps=6
    --set train.micro_batch_size=2 --set log.interval=1 --set parallel.pp=2)
set(first "")
foreach(schedule 1f1b gpipe zb-h1 zb-auto)
  run(${schedule} ${MPIRUN} -np 2 ${TRAIN} ${common} --set parallel.schedule=${schedule}
      --set output.dir=${WORK}/${schedule})
  field(${WORK}/${schedule} loss losses)
  field(${WORK}/${schedule} grad_norm norms)
  list(LENGTH losses n)
  if(NOT n EQUAL 6)
    message(FATAL_ERROR "${schedule}: expected 6 losses, got ${n}")
  endif()
  if(first STREQUAL "")
    set(first ${schedule})
    set(want_losses "${losses}")
    set(want_norms "${norms}")
  elseif(NOT losses STREQUAL want_losses OR NOT norms STREQUAL want_norms)
    message(FATAL_ERROR "${schedule} differs from ${first}:\n  losses ${losses}\n  vs     ${want_losses}\n  norms  ${norms}\n  vs     ${want_norms}")
  endif()
endforeach()
message(STATUS "gpipe, zb-h1 and zb-auto reproduce 1f1b's 6 losses and gradient norms bit for bit")
