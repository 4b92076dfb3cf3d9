#include "agent/rpc/addresses.h"

#include <gtest/gtest.h>

namespace hydra::agent {
namespace {

TEST(AddressesTest, HostsOfBindAddresses) {
  EXPECT_EQ(HostOf("0.0.0.0:9443"), "0.0.0.0");
  EXPECT_EQ(HostOf(":9443"), "");
  EXPECT_EQ(HostOf("[::1]:9443"), "::1");
  EXPECT_EQ(HostOf("10.1.2.3:0"), "10.1.2.3");
  EXPECT_EQ(HostOf("node-a.example:9443"), "node-a.example");
}

TEST(AddressesTest, LoopbackAndWildcard) {
  for (const char* h : {"127.0.0.1", "127.1.2.3", "::1", "localhost"}) {
    EXPECT_TRUE(IsLoopbackHost(h)) << h;
  }
  for (const char* h : {"0.0.0.0", "10.0.0.1", "::", "", "node-a"}) {
    EXPECT_FALSE(IsLoopbackHost(h)) << h;
  }
  for (const char* h : {"", "0.0.0.0", "::"}) EXPECT_TRUE(IsWildcardHost(h)) << h;
  EXPECT_FALSE(IsWildcardHost("127.0.0.1"));
}

TEST(AddressesTest, AConcreteBindAddressIsWhatIsAdvertised) {
  EXPECT_EQ(DefaultAdvertiseAddress("127.0.0.1:19443", 19443, "node-a"), "127.0.0.1:19443");
  EXPECT_EQ(DefaultAdvertiseAddress("10.0.0.7:0", 40123, "node-a"), "10.0.0.7:40123");
  EXPECT_EQ(DefaultAdvertiseAddress("[::1]:9443", 9443, "node-a"), "[::1]:9443");
  EXPECT_EQ(DefaultAdvertiseAddress("0.0.0.0:9443", 9443, "node-a"), "node-a:9443");
  EXPECT_EQ(DefaultAdvertiseAddress(":9443", 9443, "node-a"), "node-a:9443");
}

}  // namespace
}  // namespace hydra::agent
