// Runs the longctx binary built next to the tests, for the CLI tests.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace lc_cli {

inline const std::string kBin = LONGCTX_BINARY;

struct Result {
  int code;
  std::string out;  // stdout + stderr
};

// `longctx ARGS` through the shell; the exit code, or 128 + the signal that ended it.
inline Result run(const std::string& args) {
  const std::string cmd = kBin + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  EXPECT_NE(p, nullptr);
  std::string out;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int st = pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), out};
}

}  // namespace lc_cli
