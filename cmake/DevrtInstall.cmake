# Installation: the public headers, the static libraries, and a CMake package so that another
# project can write
#
#     find_package(devrt 0.1 REQUIRED)
#     target_link_libraries(app PRIVATE devrt::runtime)
#
# The package (lib/cmake/devrt) holds devrtConfig.cmake (finds Boost, fmt, spdlog, Threads and, in
# CUDA builds, the CUDA toolkit), devrtConfigVersion.cmake and the exported targets devrt::memory,
# devrt::devices, devrt::runtime, devrt::cuda and devrt::c (libdevrt_c.so, the C interface). The
# tools install their programs into bin.
include(CMakePackageConfigHelpers)

set(DEVRT_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/devrt CACHE STRING
    "Where the devrt CMake package is installed, relative to the prefix")

set(_devrt_installed devrt_memory devrt_devices devrt_runtime)
if(TARGET devrt_cuda)
  list(APPEND _devrt_installed devrt_cuda)
endif()
list(APPEND _devrt_installed devrt_c)  # the C interface, a shared library

# Sanitizer builds: the libraries are instrumented, so whatever links them needs the sanitizer's
# runtime too; the installed targets say so.
if(DEVRT_SANITIZE)
  string(REPLACE ";" "," _devrt_install_san "${DEVRT_SANITIZE}")
  foreach(_devrt_target IN LISTS _devrt_installed)
    set_property(TARGET ${_devrt_target} APPEND PROPERTY INTERFACE_LINK_OPTIONS
                 $<INSTALL_INTERFACE:-fsanitize=${_devrt_install_san}>)
  endforeach()
endif()

install(TARGETS ${_devrt_installed} EXPORT devrtTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

# Headers: include/devrt/{memory,devices,runtime}/*.hpp (the CUDA storage header only with CUDA)
# and the C interface, include/devrt/c_api.h.
install(DIRECTORY ${PROJECT_SOURCE_DIR}/memory/include/ ${PROJECT_SOURCE_DIR}/runtime/include/
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.hpp" PATTERN "*.h")
if(TARGET devrt_cuda)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/devices/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
          FILES_MATCHING PATTERN "*.hpp")
else()
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/devices/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
          FILES_MATCHING PATTERN "*.hpp" PATTERN "cuda_storage.hpp" EXCLUDE)
endif()

install(EXPORT devrtTargets NAMESPACE devrt:: FILE devrtTargets.cmake DESTINATION ${DEVRT_INSTALL_CMAKEDIR})

# Values devrtConfig.cmake.in reads.
set(DEVRT_CONFIG_HAS_CUDA OFF)
set(DEVRT_CONFIG_CUDA_ROOT "")
if(TARGET devrt_cuda)
  set(DEVRT_CONFIG_HAS_CUDA ON)
  get_filename_component(DEVRT_CONFIG_CUDA_ROOT "${CUDAToolkit_BIN_DIR}" DIRECTORY)
endif()
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/devrtConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/devrtConfig.cmake
                              INSTALL_DESTINATION ${DEVRT_INSTALL_CMAKEDIR})
# 0.x: a minor version may break the interface.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/devrtConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/devrtConfig.cmake ${PROJECT_BINARY_DIR}/devrtConfigVersion.cmake
        DESTINATION ${DEVRT_INSTALL_CMAKEDIR})
