// The unit-test binary's global operator new/delete, counting while an AllocationCount scope is
// open (see allocation_count.h). Every form is replaced, so that a sanitizer's interposed ones
// never pair with the frees below.
#include "common/allocation_count.h"

#include <atomic>
#include <cstdlib>
#include <new>

namespace {
std::atomic<bool> g_counting{false};
std::atomic<std::size_t> g_bytes{0};
std::atomic<std::size_t> g_calls{0};
}  // namespace
#ifndef MEMEFF_TEST_NO_ALLOCATION_COUNT
namespace {
void* counted(std::size_t n, std::size_t align) {
  if (g_counting.load(std::memory_order_relaxed)) {
    g_bytes += n;
    ++g_calls;
  }
  void* p = align > alignof(std::max_align_t)
                ? std::aligned_alloc(align, (n + align - 1) / align * align)
                : std::malloc(n ? n : 1);
  if (!p) throw std::bad_alloc();
  return p;
}
}  // namespace
void* operator new(std::size_t n) { return counted(n, 0); }
void* operator new[](std::size_t n) { return counted(n, 0); }
void* operator new(std::size_t n, std::align_val_t a) {
  return counted(n, static_cast<std::size_t>(a));
}
void* operator new[](std::size_t n, std::align_val_t a) {
  return counted(n, static_cast<std::size_t>(a));
}
// The nothrow forms too: the library's defaults call the forms above, but a sanitizer's
// interposed ones would pair their own allocation with the free below.
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return counted(n, 0);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return counted(n, 0);
  } catch (...) {
    return nullptr;
  }
}
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
#endif

namespace memeff::test {

bool allocation_counting() {
#ifdef MEMEFF_TEST_NO_ALLOCATION_COUNT
  return false;
#else
  return true;
#endif
}

AllocationCount::AllocationCount() {
  g_bytes = 0;
  g_calls = 0;
  g_counting = true;
}
AllocationCount::~AllocationCount() { g_counting = false; }
std::size_t AllocationCount::bytes() const { return g_bytes.load(); }
std::size_t AllocationCount::calls() const { return g_calls.load(); }

}  // namespace memeff::test
