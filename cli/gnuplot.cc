#include "cli/gnuplot.h"

#include <spawn.h>
#include <sys/wait.h>

#include <cerrno>

extern char** environ;

namespace hydra::cli {

Status RunGnuplot(const std::string& script_path) {
  pid_t pid = 0;
  const char* argv[] = {"gnuplot", script_path.c_str(), nullptr};
  if (posix_spawnp(&pid, "gnuplot", nullptr, nullptr, const_cast<char* const*>(argv), environ) !=
      0) {
    return UnavailableError("gnuplot is not installed (apt-get install gnuplot-nox)");
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return InternalError("gnuplot failed on " + script_path);
  }
  return OkStatus();
}

}  // namespace hydra::cli
