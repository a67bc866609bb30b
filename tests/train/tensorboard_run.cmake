# log.tensorboard: a run's event files, read by an independent decoder
# (tests/train/tensorboard_events.py), hold the losses metrics.jsonl holds.
#   -DTRAIN= -DPYTHON= -DCONFIG= -DDATA= -DWORK=
include(${CMAKE_CURRENT_LIST_DIR}/e2e_common.cmake)
file(REMOVE_RECURSE ${WORK})
run(training ${TRAIN} --config ${CONFIG} --set data.train=${DATA} --set data.val=${DATA}
    --set eval.interval=2 --set eval.batches=1 --set train.steps=4 --set log.tensorboard=true
    --set output.dir=${WORK}/run)
run("reading the events" ${PYTHON} ${CMAKE_CURRENT_LIST_DIR}/tensorboard_events.py ${WORK}/run 4)
