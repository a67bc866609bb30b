# Every pipeline schedule of one chunk per rank (gpipe, 1f1b, zb-h1, zb-auto)
# runs each stage's forwards, input gradients and weight gradients in
# microbatch order, so the weight gradients add up in the same order and the
# runs are bit-identical: the same loss and gradient norm at every step, to
# the last digit. zb-auto re-plans after step 2 from measured times, which
# must change its order but not one number. Then the same with a
# multi-token prediction module, whose embedding lookups on the last stage
# add into the tied embedding's gradient beside the head's product: under
# the split schedules both are W's (the lookups' B would put them in
# another order).
# Variables: TRAIN (triad-train), MPIRUN (list), CONFIG, DATA, WORK.
include(${CMAKE_CURRENT_LIST_DIR}/e2e_common.cmake)
file(REMOVE_RECURSE ${WORK})
set(common --config ${CONFIG} --set data.train=${DATA} --set model.n_layer=4 --set train.steps=6
    --set train.micro_batch_size=2 --set log.interval=1 --set parallel.pp=2)
foreach(mtp 0 1)
  set(first "")
  foreach(schedule 1f1b gpipe zb-h1 zb-auto)
    set(dir ${WORK}/${schedule}_mtp${mtp})
    run("${schedule}, mtp_layers ${mtp}" ${MPIRUN} -np 2 ${TRAIN} ${common}
        --set parallel.schedule=${schedule} --set model.mtp_layers=${mtp} --set output.dir=${dir})
    field(${dir} loss losses)
    field(${dir} grad_norm norms)
    list(LENGTH losses n)
    if(NOT n EQUAL 6)
      message(FATAL_ERROR "${schedule}, mtp_layers ${mtp}: expected 6 losses, got ${n}")
    endif()
    if(first STREQUAL "")
      set(first ${schedule})
      set(want_losses "${losses}")
      set(want_norms "${norms}")
    elseif(NOT losses STREQUAL want_losses OR NOT norms STREQUAL want_norms)
      message(FATAL_ERROR "mtp_layers ${mtp}: ${schedule} differs from ${first}:\n  losses ${losses}\n  vs     ${want_losses}\n  norms  ${norms}\n  vs     ${want_norms}")
    endif()
  endforeach()
  message(STATUS "mtp_layers ${mtp}: gpipe, zb-h1 and zb-auto reproduce 1f1b's 6 losses and gradient norms bit for bit")
endforeach()
