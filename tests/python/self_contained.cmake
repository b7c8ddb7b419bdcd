# CTest cases: no tracked file cites a document outside the repository (and the check can fail).
add_test(NAME repo_self_contained
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/check_self_contained.py
    --repo ${PROJECT_SOURCE_DIR})
add_test(NAME repo_self_contained_selftest
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/check_self_contained.py --self-test)
set_tests_properties(repo_self_contained repo_self_contained_selftest PROPERTIES
  TIMEOUT 120 LABELS "repo;python" SKIP_RETURN_CODE 77)
