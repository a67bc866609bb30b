# triad-tokenize over several inputs, compressed or not: a gzip and a
# Zstandard copy of a text (or the gzip copy and the text on the standard
# input) tokenize to the very bytes the plain text gives twice, each file a
# document of its own under --documents whole.
# Variables: TOKENIZE (triad-tokenize), TEXT (a text file), WORK.
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
file(ARCHIVE_CREATE OUTPUT ${WORK}/text.gz PATHS ${TEXT} FORMAT raw COMPRESSION GZip)
file(ARCHIVE_CREATE OUTPUT ${WORK}/text.zst PATHS ${TEXT} FORMAT raw COMPRESSION Zstd)
foreach(split paragraphs whole)
  foreach(kind plain packed)
    if(kind STREQUAL plain)
      set(inputs ${TEXT} ${TEXT})
    else()
      set(inputs ${WORK}/text.gz ${WORK}/text.zst)
    endif()
    execute_process(COMMAND ${TOKENIZE} --input ${inputs} --documents ${split} --eod 0
                            --output ${WORK}/${kind}_${split}.bin
                    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "triad-tokenize ${inputs} failed (${rc}): ${out}")
    endif()
    message(STATUS "${kind} ${split}: ${out}")
    if(split STREQUAL whole AND NOT out MATCHES "in 2 documents")
      message(FATAL_ERROR "--documents whole over two inputs: not two documents: ${out}")
    endif()
  endforeach()
  # The same text through the standard input, after the gzip file.
  execute_process(COMMAND ${TOKENIZE} --input ${WORK}/text.gz - --documents ${split} --eod 0
                          --output ${WORK}/piped_${split}.bin
                  INPUT_FILE ${TEXT} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "triad-tokenize --input text.gz - failed (${rc}): ${out}")
  endif()
  file(SHA256 ${WORK}/piped_${split}.bin piped)
  file(SHA256 ${WORK}/plain_${split}.bin plain)
  if(NOT plain STREQUAL piped)
    message(FATAL_ERROR "--documents ${split}: the standard input tokenizes to other bytes")
  endif()
  file(SHA256 ${WORK}/packed_${split}.bin packed)
  if(NOT plain STREQUAL packed)
    message(FATAL_ERROR "--documents ${split}: the compressed inputs tokenize to other bytes")
  endif()
endforeach()
