# Warnings for devrt's own targets (not for third-party code).
function(devrt_set_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor
                                           -Wold-style-cast -Wcast-align -Wunused -Woverloaded-virtual
                                           -Wdouble-promotion -Wformat=2
                                           -Wno-missing-field-initializers)
  # Sanitizer presets build with warnings as warnings: GCC 12 reports false positives
  # (maybe-uninitialized, array-bounds) in the standard library under the sanitizers. The debug and
  # release presets keep -Werror.
  if(DEVRT_SANITIZE AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    target_compile_options(${target} PRIVATE -Wno-maybe-uninitialized -Wno-array-bounds)
  endif()
  if("thread" IN_LIST DEVRT_SANITIZE)
    # Boost.Asio uses std::atomic_thread_fence, which GCC warns TSan does not model.
    target_compile_options(${target} PRIVATE -Wno-tsan)
  endif()
  if(DEVRT_WARNINGS_AS_ERRORS)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()
