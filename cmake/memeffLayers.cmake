# The library's layers (docs: ../DESIGN's "Layout"): each is an object library whose include root
# holds only what the layer may include, so an include that points the wrong way fails to build.
#
# memeff_layer(NAME SOURCES files... MAY_INCLUDE paths...)
#   paths are relative to src/: a folder ("core") or single files ("core/philox.h"). The layer's
#   include root is a folder of the build tree with a link to each of them under the same relative
#   path, so sources keep writing "core/philox.h" and find nothing they were not given. The
#   public headers (include/memeff) are visible to every layer.
function(memeff_layer name)
  cmake_parse_arguments(L "" "" "SOURCES;MAY_INCLUDE" ${ARGN})
  add_library(${name} OBJECT ${L_SOURCES})
  set(root ${PROJECT_BINARY_DIR}/include-roots/${name})
  file(REMOVE_RECURSE ${root})
  foreach(path IN LISTS L_MAY_INCLUDE)
    if(NOT EXISTS ${PROJECT_SOURCE_DIR}/src/${path})
      message(FATAL_ERROR "memeff_layer(${name}): src/${path} does not exist")
    endif()
    get_filename_component(parent ${root}/${path} DIRECTORY)
    file(MAKE_DIRECTORY ${parent})
    file(CREATE_LINK ${PROJECT_SOURCE_DIR}/src/${path} ${root}/${path} SYMBOLIC)
  endforeach()
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/include ${root})
  set_target_properties(${name} PROPERTIES MEMEFF_INCLUDE_ROOT ${root})
  target_compile_definitions(${name} PRIVATE $<$<BOOL:${MEMEFF_WITH_CUDA}>:MEMEFF_WITH_CUDA=1>)
  target_compile_options(${name} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${MEMEFF_WARNINGS}>)
  # The objects go into libmemeff, a shared one too.
  set_target_properties(${name} PROPERTIES POSITION_INDEPENDENT_CODE ON)
  target_sources(memeff PRIVATE $<TARGET_OBJECTS:${name}>)
endfunction()
