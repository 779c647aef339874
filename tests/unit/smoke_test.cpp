#include <gtest/gtest.h>
#include "memeff/attention.h"
TEST(Smoke, Version) { EXPECT_STREQ(memeff::version(), "0.1.0"); }
