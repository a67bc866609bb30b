# The environment every test runs in.
#
# OpenMP's threads wait for work by spinning (GCC's default), which suits a
# machine given to one program and not CTest's -j: two tests' spinning
# threads take each other's cores. A tiny training run takes 1.8 s alone and
# 7.5 s beside another when both spin, 2.3 s when both wait passively.
set(TRIAD_TEST_ENVIRONMENT OMP_WAIT_POLICY=passive)

# triad_test_environment(): gives every test the calling directory has added
# so far (add_test) TRIAD_TEST_ENVIRONMENT; call it after the directory's
# last test. Tests found by gtest_discover_tests take it in their PROPERTIES.
function(triad_test_environment)
  get_property(tests DIRECTORY PROPERTY TESTS)
  foreach(t IN LISTS tests)
    set_property(TEST ${t} APPEND PROPERTY ENVIRONMENT ${TRIAD_TEST_ENVIRONMENT})
  endforeach()
endfunction()
