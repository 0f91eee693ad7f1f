// `longctx serve` as a process: a slot saved by one server and restored by a new server process
// continues identically (the prefix comes from the file, not recomputed), SIGTERM stops a server
// cleanly, and bad flags are errors before anything listens.
#include <gtest/gtest.h>
#include <httplib.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "cli/run_cli.h"

namespace {

using nlohmann::json;
const std::string kStories = std::string(LONGCTX_TEST_DATA) + "/golden/models/stories260K.gguf";

// A server process on a free port; the port is read from its "listening on" line.
struct ServeProcess {
  pid_t pid = -1;
  int port = 0;
  FILE* out = nullptr;
  explicit ServeProcess(const std::string& args) {
    int fds[2];
    if (pipe(fds) != 0) return;
    pid = fork();
    if (pid == 0) {
      dup2(fds[1], 1);
      close(fds[0]);
      close(fds[1]);
      const std::string cmd = std::string("exec ") + LONGCTX_BINARY + " serve --port 0 " + args + " 2>/dev/null";
      execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    close(fds[1]);
    out = fdopen(fds[0], "r");
    char line[512];
    while (out && fgets(line, sizeof line, out)) {
      const std::string l = line;
      const auto at = l.find("listening on http://127.0.0.1:");
      if (at != std::string::npos) {
        port = std::stoi(l.substr(at + 30));
        break;
      }
    }
  }
  // SIGTERM, then the exit status.
  int stop() {
    if (pid <= 0) return -1;
    kill(pid, SIGTERM);
    int st = 0;
    waitpid(pid, &st, 0);
    pid = -1;
    if (out) fclose(out);
    out = nullptr;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }
  ~ServeProcess() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    if (out) fclose(out);
  }
};

json post(int port, const std::string& path, const json& body, int* status = nullptr) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(120, 0);
  auto r = c.Post(path.c_str(), body.dump(), "application/json");
  EXPECT_TRUE(r) << path;
  if (!r) return json();
  if (status) *status = r->status;
  return json::parse(r->body, nullptr, false);
}

TEST(ServeCli, SlotRestoredInANewProcessContinuesIdentically) {
  const std::string dir = (std::filesystem::temp_directory_path() / "lc_serve_cli_slots").string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string prompt =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "
      "One day, she saw a big red ball under a tree.";
  const json req = {{"prompt", prompt}, {"max_tokens", 24}, {"temperature", 0}};
  const std::string args = "-m " + kStories + " -np 1 -t 1 --slot-save-path " + dir;
  json first;
  {
    ServeProcess a(args);
    ASSERT_GT(a.port, 0);
    int status = 0;
    first = post(a.port, "/v1/completions", req, &status);
    ASSERT_EQ(status, 200) << first.dump();
    json s = post(a.port, "/slots/0?action=save", {{"filename", "s.bin"}}, &status);
    ASSERT_EQ(status, 200) << s.dump();
    EXPECT_EQ(a.stop(), 0);  // SIGTERM: a clean exit
  }
  ServeProcess b(args);
  ASSERT_GT(b.port, 0);
  int status = 0;
  json r = post(b.port, "/slots/0?action=restore", {{"filename", "s.bin"}}, &status);
  ASSERT_EQ(status, 200) << r.dump();
  json again = post(b.port, "/v1/completions", req, &status);
  ASSERT_EQ(status, 200) << again.dump();
  EXPECT_EQ(again["timings"]["cache_n"].get<int64_t>(), first["usage"]["prompt_tokens"].get<int64_t>() - 1);
  EXPECT_EQ(again["choices"][0]["text"], first["choices"][0]["text"]);
  EXPECT_EQ(b.stop(), 0);
  std::filesystem::remove_all(dir);
}

TEST(ServeCli, BadFlagsAreErrors) {
  auto r = lc_cli::run("serve -m " + kStories + " --schedule lifo --port 0");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("lifo"), std::string::npos) << r.out;
  r = lc_cli::run("serve -m " + kStories + " -np 0 --port 0");
  EXPECT_NE(r.code, 0);
  r = lc_cli::run("serve -m " + kStories + " --slot-save-path /nonexistent/dir --port 0");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("--slot-save-path"), std::string::npos) << r.out;
  r = lc_cli::run("serve -m " + kStories + " --attn nosuch --port 0");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("nosuch"), std::string::npos) << r.out;
}

}  // namespace
