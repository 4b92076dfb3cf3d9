# hydra_cc_library / hydra_cc_test: keep the per-component CMake short (in the style of Abseil).
set(HYDRA_WARNINGS -Wall -Wextra -Wno-unused-parameter)

# hydra_cc_library(NAME name SRCS a.cc ... [DEPS dep ...] [TORCH])
# TORCH: the library includes LibTorch and reuses the shared precompiled torch header.
function(hydra_cc_library)
  cmake_parse_arguments(ARG "TORCH" "NAME" "SRCS;DEPS" ${ARGN})
  add_library(${ARG_NAME} STATIC ${ARG_SRCS})
  target_include_directories(${ARG_NAME} PUBLIC ${CMAKE_SOURCE_DIR} ${CMAKE_BINARY_DIR})
  target_link_libraries(${ARG_NAME} PUBLIC ${ARG_DEPS})
  target_compile_options(${ARG_NAME} PRIVATE ${HYDRA_WARNINGS})
  if(ARG_TORCH)
    target_link_libraries(${ARG_NAME} PUBLIC ${TORCH_LIBRARIES})
    target_precompile_headers(${ARG_NAME} REUSE_FROM hydra_torch_pch)
  endif()
endfunction()

# hydra_cc_test(NAME name SRCS a_test.cc ... [DEPS dep ...] [TORCH] [LABELS l ...])
function(hydra_cc_test)
  cmake_parse_arguments(ARG "TORCH" "NAME" "SRCS;DEPS;LABELS" ${ARGN})
  add_executable(${ARG_NAME} ${ARG_SRCS})
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gtest_main GTest::gmock)
  target_include_directories(${ARG_NAME} PRIVATE ${CMAKE_SOURCE_DIR})
  target_compile_options(${ARG_NAME} PRIVATE ${HYDRA_WARNINGS})
  target_compile_definitions(${ARG_NAME} PRIVATE HYDRA_SOURCE_DIR="${CMAKE_SOURCE_DIR}"
                                                 HYDRA_BINARY_DIR="${CMAKE_BINARY_DIR}")
  if(ARG_TORCH)
    target_link_libraries(${ARG_NAME} PRIVATE ${TORCH_LIBRARIES})
    target_precompile_headers(${ARG_NAME} REUSE_FROM hydra_torch_pch)
  endif()
  add_test(NAME ${ARG_NAME} COMMAND ${ARG_NAME})
  if(ARG_LABELS)
    set_tests_properties(${ARG_NAME} PROPERTIES LABELS "${ARG_LABELS}")
  endif()
endfunction()

# hydra_shared_libstdcxx(VAR): VAR = the path of the shared libstdc++ (libstdc++.so.6) the C++
# compiler links against, for naming it on a link line by its file rather than by -lstdc++
# (which may find a static libstdc++.a first). Fails configuration if there is none.
function(hydra_shared_libstdcxx VAR)
  execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=libstdc++.so.6
                  OUTPUT_VARIABLE path OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT IS_ABSOLUTE "${path}" OR NOT EXISTS "${path}")
    # The compiler does not know it by that name: its multiarch directories may still have it.
    find_library(HYDRA_LIBSTDCXX_SO NAMES libstdc++.so.6
                 PATHS /lib/${CMAKE_LIBRARY_ARCHITECTURE} /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}
                       /lib64 /usr/lib64 NO_DEFAULT_PATH)
    set(path "${HYDRA_LIBSTDCXX_SO}")
  endif()
  if(NOT path OR NOT EXISTS "${path}")
    message(FATAL_ERROR "no shared libstdc++ (libstdc++.so.6) beside ${CMAKE_CXX_COMPILER}: the "
                        "CUDA build must list it ahead of LibTorch (CMakeLists.txt)")
  endif()
  get_filename_component(path "${path}" REALPATH)
  message(STATUS "libstdc++ first in every program's libraries: ${path}")
  set(${VAR} "${path}" PARENT_SCOPE)
endfunction()
