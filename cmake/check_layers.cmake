# The layer rule of docs/architecture.md, checked on every #include of the tree:
#
#   cmake -DROOT=<a source tree> -P cmake/check_layers.cmake
#
# A file's layer is its folder: include/mha/<layer>/ and src/<layer>/ (tests/<layer>/ tests that
# layer and may include what it may). It may include
#   - "mha/<other>/..." only for an <other> its layer may use (the table below);
#   - its own folder's internal headers by a relative path or, in src/, a path from src/
#     ("attention/tiles/kernels-inl.h" for Highway's re-inclusion), never another layer's;
#   - in tests/, only public headers and tests/support (no "../../src/...").
# Prints every violation as file:line and fails if there is one. ctest "layers" runs it on the
# project; the "layers.rejects.*" tests run it on the small broken trees in tests/layer_check/
# (which it skips when checking the project) to show that it fails where it must.
cmake_minimum_required(VERSION 3.20)
if(NOT ROOT)
  message(FATAL_ERROR "check_layers: ROOT: expected -DROOT=<source tree>, got nothing")
endif()
get_filename_component(ROOT "${ROOT}" ABSOLUTE)

# What each layer may include (itself included). Nothing may include a layer above it.
set(uses_core        core)
set(uses_attention   core attention)
set(uses_nn          core attention nn)
set(uses_optim       core attention nn optim)
set(uses_text        core text)
set(uses_data        core data)
set(uses_viz         core viz)
set(uses_models      core attention nn optim text models)
set(uses_train       core attention nn optim text data viz models train)
set(uses_distributed core attention nn optim distributed)
set(uses_support     core attention nn)  # tests/support: used by the tests of every layer above core
set(all_layers core attention nn optim text data viz models train distributed)
set(uses_application ${all_layers})      # tools/, python/, examples/, fuzz/, CLI and example tests
set(test_layer_training train)           # tests/training tests src/train

# starts_with(<out> <text> <prefix>): a plain prefix test (paths may hold regex characters).
function(starts_with out text prefix)
  string(FIND "${text}" "${prefix}" at)
  if(at EQUAL 0)
    set(${out} TRUE PARENT_SCOPE)
  else()
    set(${out} FALSE PARENT_SCOPE)
  endif()
endfunction()

set(violations 0)
macro(violation file line text)
  file(RELATIVE_PATH _where "${ROOT}" "${file}")
  message("${_where}:${line}: ${text}")
  math(EXPR violations "${violations} + 1")
endmacro()

file(GLOB_RECURSE files LIST_DIRECTORIES false
     "${ROOT}/include/*" "${ROOT}/src/*" "${ROOT}/tests/*" "${ROOT}/fuzz/*" "${ROOT}/tools/*"
     "${ROOT}/examples/*" "${ROOT}/python/*")
list(FILTER files INCLUDE REGEX "\\.(h|hpp|cpp|cc|inl)$")
foreach(file ${files})
  file(RELATIVE_PATH rel "${ROOT}" "${file}")
  if(rel MATCHES "^tests/layer_check/")
    continue()  # the broken trees the checker is tested on
  endif()
  get_filename_component(dir "${file}" DIRECTORY)
  # The file's layer, the folder its relative includes must stay in, and what it may use.
  if(rel MATCHES "^include/mha/([a-z_]+)/")
    set(layer ${CMAKE_MATCH_1})
    set(home "${ROOT}/include/mha/${layer}")
  elseif(rel MATCHES "^src/([a-z_]+)/")
    set(layer ${CMAKE_MATCH_1})
    set(home "${ROOT}/src/${layer}")
  elseif(rel MATCHES "^tests/support/")
    set(layer support)
    set(home "${ROOT}/tests/support")
  elseif(rel MATCHES "^tests/([a-z_]+)/")
    set(layer ${CMAKE_MATCH_1})
    if(DEFINED test_layer_${layer})
      set(layer ${test_layer_${layer}})
    endif()
    if(NOT DEFINED uses_${layer})
      set(layer application)  # tests/cli, tests/examples, tests/consumers, ...
    endif()
    set(home "${dir}")
  elseif(rel MATCHES "^(tools|python|examples|fuzz)/")
    set(layer application)
    set(home "${ROOT}/${CMAKE_MATCH_1}")
  else()
    continue()
  endif()
  if(NOT DEFINED uses_${layer})
    violation("${file}" 1 "folder '${layer}' has no place in the layer rule (docs/architecture.md)")
    continue()
  endif()

  # One list element per line, numbered as an editor numbers them: ';' and brackets would split
  # or join CMake list elements, and include lines never need them.
  file(READ "${file}" lines)
  string(REPLACE ";" "," lines "${lines}")
  string(REPLACE "[" "(" lines "${lines}")
  string(REPLACE "]" ")" lines "${lines}")
  string(REPLACE "\n" ";" lines "${lines}")
  set(number 0)
  foreach(line IN LISTS lines)
    math(EXPR number "${number} + 1")
    if(NOT line MATCHES "^[ \t]*#[ \t]*include[ \t]*[\"<]([^\">]+)[\">]")
      continue()
    endif()
    set(included "${CMAKE_MATCH_1}")
    if(included MATCHES "^mha/([a-z_]+)/")
      # A public header: its layer must be one this file's layer may use.
      set(target_layer ${CMAKE_MATCH_1})
      if(NOT target_layer IN_LIST uses_${layer})
        string(REPLACE ";" ", " allowed "${uses_${layer}}")
        violation("${file}" ${number} "layer '${layer}' includes \"${included}\" from layer '${target_layer}'; it may use: ${allowed}")
      endif()
      continue()
    endif()
    # A project file named relative to the includer, or (src/ only) relative to src/.
    get_filename_component(resolved "${dir}/${included}" ABSOLUTE)
    if(NOT EXISTS "${resolved}" AND rel MATCHES "^src/")
      get_filename_component(resolved "${ROOT}/src/${included}" ABSOLUTE)
    endif()
    if(NOT EXISTS "${resolved}")
      continue()  # a system or third-party header ("hwy/highway.h")
    endif()
    starts_with(inside "${resolved}" "${home}/")
    starts_with(in_support "${resolved}" "${ROOT}/tests/support/")
    if(rel MATCHES "^tests/" AND in_support)
      set(inside TRUE)  # the documented test seam
    endif()
    if(NOT inside)
      file(RELATIVE_PATH shown "${ROOT}" "${resolved}")
      file(RELATIVE_PATH home_shown "${ROOT}" "${home}")
      violation("${file}" ${number} "includes \"${included}\" (${shown}), outside its own folder ${home_shown}/; use a public header \"mha/...\"")
    endif()
  endforeach()
endforeach()

list(LENGTH files checked)
if(violations GREATER 0)
  message(FATAL_ERROR "check_layers: ${violations} include(s) break the layer rule in ${checked} files under ${ROOT}")
endif()
message("check_layers: ${checked} files follow the layer rule")
