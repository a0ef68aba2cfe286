# Shared by both consumers: checks what mha's targets bring to a program that links them.
# mha::mha (the attention core) must not pull in libpng, zlib or the layers above it, so a user
# or the Python wheel linking attention gets none of them.
foreach(target mha::mha mha::viz mha::data mha::models mha::train)
  if(NOT TARGET ${target})
    message(FATAL_ERROR "${target}: expected mha to provide this target, it does not")
  endif()
endforeach()
get_target_property(core_links mha::mha INTERFACE_LINK_LIBRARIES)
if(core_links MATCHES "PNG|ZLIB|mha_(viz|data|models|train)|mha::(viz|data|models|train)")
  message(FATAL_ERROR "mha::mha: expected a link interface without libpng, zlib or the layers above "
                      "the core, got: ${core_links}")
endif()
message(STATUS "mha::mha links: ${core_links}")

add_executable(consumer ${CMAKE_CURRENT_LIST_DIR}/main.cpp)
target_link_libraries(consumer PRIVATE mha::mha)
