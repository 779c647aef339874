# Install rules and the exported CMake package: `cmake --install build --prefix P` puts the
# library, include/memeff, the `memeff` program (tools/CMakeLists.txt adds it to the same export)
# and lib/cmake/memeff/{memeffConfig,memeffConfigVersion,memeffTargets}.cmake under P, so that a
# user writes find_package(memeff 0.1 CONFIG REQUIRED) and links memeff::memeff.
include(CMakePackageConfigHelpers)

set(MEMEFF_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/memeff)
set_target_properties(memeff PROPERTIES EXPORT_NAME memeff VERSION ${PROJECT_VERSION}
                                        SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR})

install(TARGETS memeff EXPORT memeffTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/memeff DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h")
install(EXPORT memeffTargets NAMESPACE memeff:: DESTINATION ${MEMEFF_INSTALL_CMAKEDIR})

configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/memeffConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/memeffConfig.cmake
                              INSTALL_DESTINATION ${MEMEFF_INSTALL_CMAKEDIR})
# 0.x: a minor version may break the API, so 0.1 accepts 0.1.* only.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/memeffConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/memeffConfig.cmake ${PROJECT_BINARY_DIR}/memeffConfigVersion.cmake
        DESTINATION ${MEMEFF_INSTALL_CMAKEDIR})
