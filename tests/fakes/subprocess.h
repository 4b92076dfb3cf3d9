#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

/// Test-only helpers to run real binaries as child processes.
namespace hydra::fakes {

/// A child process whose stdout and stderr go to `out_path`.
struct Proc {
  pid_t pid = -1;
  std::string out_path;
};

/// Starts `binary args...`; pid stays -1 if it could not be started.
inline Proc Start(const std::string& binary, const std::vector<std::string>& args,
                  const std::string& out_path) {
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(binary.c_str()));
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  Proc p;
  p.out_path = out_path;
  if (posix_spawn(&p.pid, binary.c_str(), &fa, nullptr, argv.data(), environ) != 0) p.pid = -1;
  posix_spawn_file_actions_destroy(&fa);
  return p;
}

/// Waits for the process; its exit code, or 128 + the signal that killed it.
inline int Wait(const Proc& p) {
  int status = 0;
  if (p.pid <= 0 || waitpid(p.pid, &status, 0) != p.pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/// Sends `sig` and waits at most `timeout`; SIGKILL after that. The exit code as Wait.
inline int Stop(const Proc& p, int sig = SIGTERM,
                std::chrono::seconds timeout = std::chrono::seconds(30)) {
  if (p.pid <= 0) return -1;
  kill(p.pid, sig);
  const auto end = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  while (std::chrono::steady_clock::now() < end) {
    if (waitpid(p.pid, &status, WNOHANG) == p.pid) {
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(p.pid, SIGKILL);
  waitpid(p.pid, &status, 0);
  return 128 + SIGKILL;
}

inline std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

/// Waits up to `timeout` for `needle` to appear in the process's output file. False if the
/// process exits first (it is reaped: `*exit_code` receives its code as Wait gives it) or the
/// time runs out (the process is left running).
inline bool WaitForOutput(const Proc& p, const std::string& needle, std::chrono::seconds timeout,
                          int* exit_code = nullptr) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (Slurp(p.out_path).find(needle) != std::string::npos) return true;
    int status = 0;
    if (p.pid > 0 && waitpid(p.pid, &status, WNOHANG) == p.pid) {
      if (exit_code) *exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

/// A TCP port on 127.0.0.1 that was free a moment ago (the kernel picked it).
inline int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

}  // namespace hydra::fakes
