# log.tensorboard: a run's event files, read by an independent decoder
# (tests/train/tensorboard_events.py), hold the losses and samples
# metrics.jsonl holds.
#   -DTRAIN= -DPYTHON= -DCONFIG= -DDATA= -DWORK=
include(${CMAKE_CURRENT_LIST_DIR}/e2e_common.cmake)
file(REMOVE_RECURSE ${WORK})
run(training ${TRAIN} --config ${CONFIG} --set data.train=${DATA} --set data.val=${DATA}
    --set eval.interval=2 --set eval.batches=1 --set train.steps=4 --set log.tensorboard=true
    --set log.param_norm=true --set log.grad_norms=layers --set log.param_norms=layers
    --set train.weight_decay_schedule=cosine --set train.weight_decay_start=0.01
    --set "eval.samples=[Once, The]" --set eval.sample_tokens=8 --set output.dir=${WORK}/run)
# The console line names the layer of the largest gradient norm (log.grad_norms).
if(NOT run_output MATCHES "\\| top grad (h\\.[0-9]+|wte|wpe|ln_f) [0-9]+\\.[0-9]+")
  message(FATAL_ERROR "no 'top grad <layer> <norm>' in the step lines:\n${run_output}")
endif()
# Two evaluations of two samples each.
run("reading the events" ${PYTHON} ${CMAKE_CURRENT_LIST_DIR}/tensorboard_events.py ${WORK}/run 4 4)
