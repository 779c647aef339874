// Allocation counting for tests: tests/common/allocation_count.cpp replaces the global operator
// new/delete of the unit-test binary, and an AllocationCount scope counts every allocation made
// by any thread while it is open (one scope at a time).
#pragma once

#include <cstddef>

namespace memeff::test {

// False in a build whose sanitizer runtime defines operator new and delete itself
// (ThreadSanitizer's is linked whole: tests/CMakeLists.txt defines MEMEFF_TEST_NO_ALLOCATION_COUNT
// there): the forms are not replaced and scopes count nothing, so tests skip their counts.
bool allocation_counting();

class AllocationCount {
 public:
  AllocationCount();   // starts counting from zero
  ~AllocationCount();  // stops counting
  AllocationCount(const AllocationCount&) = delete;
  AllocationCount& operator=(const AllocationCount&) = delete;

  std::size_t bytes() const;  // bytes asked for so far
  std::size_t calls() const;  // operator new calls so far
};

}  // namespace memeff::test
