# Helpers of the triad-eval scripts (included with -P scripts).

# A non-negative JSON number below 10^12 without an exponent as millionths
# (CMake has no floating point).
function(millionths value out)
  if(NOT value MATCHES "^([0-9]+)([.]([0-9]*))?$")
    message(FATAL_ERROR "'${value}' is not a non-negative number without an exponent")
  endif()
  set(whole ${CMAKE_MATCH_1})
  string(SUBSTRING "${CMAKE_MATCH_3}000000" 0 6 frac)
  # (A leading 1 keeps the fraction's zeros: math would read 000050 as octal
  # or stop, and a REGEX REPLACE anchored at ^ strips zeros from the middle.)
  math(EXPR m "${whole} * 1000000 + 1${frac} - 1000000")
  set(${out} ${m} PARENT_SCOPE)
endfunction()

# Fails unless |a - b| <= tol millionths, naming `what`.
function(expect_within a b tol what)
  millionths("${a}" am)
  millionths("${b}" bm)
  math(EXPR diff "${am} - ${bm}")
  if(diff GREATER ${tol} OR diff LESS -${tol})
    message(FATAL_ERROR "${what}: ${a} and ${b} differ by more than ${tol} millionths")
  endif()
endfunction()
