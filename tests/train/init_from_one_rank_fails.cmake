# A pipeline rank reads only its own blocks of init.from's weights, so only
# the rank holding a broken block finds it: every rank must still stop with
# an error (none waiting for the others), the failing one naming the
# tensor, the others naming the failing rank.
# The weights are a one-process run's model.safetensors behind a sharded
# checkpoint's index that also lists a tensor of the last block which the
# shard lacks: read by the last stage only.
# Variables: TRAIN (triad-train), MPIRUN (list), CONFIG, DATA, WORK.
include(${CMAKE_CURRENT_LIST_DIR}/e2e_common.cmake)
file(REMOVE_RECURSE ${WORK})
set(common --config ${CONFIG} --set data.train=${DATA} --set train.steps=1 --set log.interval=1
    --set data.val=null --set eval.interval=0 --set eval.batches=0)
run(init ${TRAIN} ${common} --set output.dir=${WORK}/init)

# The shard's tensor names, from its JSON header (8 bytes of little-endian
# length first).
file(READ ${WORK}/init/model.safetensors length_hex LIMIT 8 HEX)
set(length 0)
foreach(i RANGE 7 0 -1)
  math(EXPR at "${i} * 2")
  string(SUBSTRING "${length_hex}" ${at} 2 byte)
  math(EXPR length "${length} * 256 + 0x${byte}")
endforeach()
file(READ ${WORK}/init/model.safetensors header OFFSET 8 LIMIT ${length})
string(JSON count LENGTH "${header}")
set(map "")
math(EXPR last "${count} - 1")
foreach(i RANGE ${last})
  string(JSON name MEMBER "${header}" ${i})
  if(NOT name STREQUAL "__metadata__")
    string(APPEND map "\"${name}\": \"part.safetensors\", ")
  endif()
endforeach()
if(NOT map MATCHES "h.3.mlp.c_fc.weight")
  message(FATAL_ERROR "the 4-layer model's weights lack h.3.mlp.c_fc.weight:\n${header}")
endif()
file(MAKE_DIRECTORY ${WORK}/sharded)
file(COPY_FILE ${WORK}/init/model.safetensors ${WORK}/sharded/part.safetensors)
file(WRITE ${WORK}/sharded/model.safetensors.index.json
     "{\"weight_map\": {${map}\"h.3.mlp.extra.weight\": \"part.safetensors\"}}")

execute_process(COMMAND ${MPIRUN} -np 2 ${TRAIN} ${common} --set parallel.pp=2
                        --set init.from=${WORK}/sharded --set output.dir=${WORK}/pp2
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out TIMEOUT 120)
if(rc EQUAL 0 OR rc MATCHES "timeout")
  message(FATAL_ERROR "pp 2 from a broken last block: expected an error, got '${rc}':\n${out}")
endif()
foreach(expected "lacks 'h.3.mlp.extra.weight', which the index lists"
                 "rank 1 could not read its part of the weights")
  string(FIND "${out}" "${expected}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "pp 2 from a broken last block: no '${expected}' in:\n${out}")
  endif()
endforeach()
# The same file's first blocks are whole: one process reading everything
# finds the broken one too.
execute_process(COMMAND ${TRAIN} ${common} --set init.from=${WORK}/sharded
                        --set output.dir=${WORK}/one
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
string(FIND "${out}" "lacks 'h.3.mlp.extra.weight'" at)
if(rc EQUAL 0 OR at EQUAL -1)
  message(FATAL_ERROR "one process from a broken last block: expected the error, got ${rc}:\n${out}")
endif()
message(STATUS "every rank stopped; rank 1 named the tensor, rank 0 the rank")
