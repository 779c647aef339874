// The memeff command-line program (being written; see tools/README once it lands).
#include <cstdio>

#include "memeff/attention.h"

int main() {
  std::printf("memeff %s\n", memeff::version());
  return 0;
}
