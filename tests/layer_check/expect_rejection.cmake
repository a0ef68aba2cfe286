# cmake -DTREE=<broken tree> -DCHECK=<check_layers.cmake> -DEXPECT=<text> -P expect_rejection.cmake
# Passes only if the layer check fails on TREE (non-zero exit) and prints EXPECT among its reasons.
execute_process(COMMAND ${CMAKE_COMMAND} -DROOT=${TREE} -P ${CHECK}
                RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(status EQUAL 0)
  message(FATAL_ERROR "expected the layer check to reject ${TREE}; it accepted it")
endif()
string(FIND "${out}${err}" "${EXPECT}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "the layer check rejected ${TREE} without saying: ${EXPECT}")
endif()
