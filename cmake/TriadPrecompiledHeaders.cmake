# Precompiled headers for the targets with many translation units or heavy
# header-only libraries (GoogleTest, CLI11, nlohmann/json, spdlog), where
# parsing the same headers again is a large share of the build: the unit
# tests' 70 files and the example programs and benchmarks, which all include
# CLI11. The library itself does not use one: its files spend their time in
# code generation, and a PCH saved about a tenth there.
#
# TRIAD_PRECOMPILED_HEADERS=OFF builds without them (e.g. to check that every
# file includes what it uses).

option(TRIAD_PRECOMPILED_HEADERS "Precompile the headers shared by the tests, examples and benchmarks" ON)

# The test files' shared headers: the test framework, the standard library
# parts most of them use, and Triad's ops, autograd and GPT.
set(TRIAD_TEST_PCH_HEADERS
    <gtest/gtest.h> <algorithm> <cmath> <cstring> <filesystem> <fstream> <functional> <map>
    <memory> <set> <sstream> <string> <vector> <nlohmann/json.hpp>
    "${PROJECT_SOURCE_DIR}/include/triad/ops.h"
    "${PROJECT_SOURCE_DIR}/include/triad/autograd/engine.h"
    "${PROJECT_SOURCE_DIR}/include/triad/core/error.h"
    "${PROJECT_SOURCE_DIR}/include/triad/nn/gpt.h")

# The command-line programs' shared headers.
set(TRIAD_TOOL_PCH_HEADERS
    <CLI/CLI.hpp> <nlohmann/json.hpp> <spdlog/spdlog.h> <algorithm> <chrono> <cstdio> <fstream>
    <functional> <memory> <string> <vector>
    "${PROJECT_SOURCE_DIR}/include/triad/core/error.h"
    "${PROJECT_SOURCE_DIR}/include/triad/ops.h")

# triad_precompile_test_headers(target): the test headers, precompiled for
# this target alone (test targets differ in their definitions).
function(triad_precompile_test_headers target)
  if(TRIAD_PRECOMPILED_HEADERS)
    target_precompile_headers(${target} PRIVATE ${TRIAD_TEST_PCH_HEADERS})
  endif()
endfunction()

# triad_precompile_tool_headers(target): the programs' headers, compiled once
# for the first program that asks and reused by the rest. Only for programs
# with the first one's flags and definitions: GCC refuses a PCH built with
# others (-Winvalid-pch says so, and it parses the headers instead), and one
# built at another -O level can crash it (the examples and the benchmarks
# all build at -O1 in a release build).
function(triad_precompile_tool_headers target)
  if(NOT TRIAD_PRECOMPILED_HEADERS)
    return()
  endif()
  get_property(_owner GLOBAL PROPERTY TRIAD_TOOL_PCH_OWNER)
  if(_owner)
    target_precompile_headers(${target} REUSE_FROM ${_owner})
  else()
    target_precompile_headers(${target} PRIVATE ${TRIAD_TOOL_PCH_HEADERS})
    set_property(GLOBAL PROPERTY TRIAD_TOOL_PCH_OWNER ${target})
  endif()
endfunction()
