#include "cli/progress.h"

#include <cmath>

#include "common/units.h"

namespace hydra::cli {
namespace {

using Clock = std::chrono::steady_clock;

std::string Num(double v, const char* fmt) {
  if (!std::isfinite(v)) return "-";
  char buf[64];
  std::snprintf(buf, sizeof(buf), fmt, v);
  return buf;
}

class TerminalProgress : public ProgressSinkInterface {
 public:
  TerminalProgress(FILE* out, double hz) : out_(out), min_interval_(1.0 / hz) {}

  void OnJobStart(const std::string& job, const std::vector<TrialResult>& trials) override {
    job_ = job;
    trials_ = trials;
    start_ = Clock::now();
    name_width_ = 5;
    for (const auto& t : trials_) name_width_ = std::max(name_width_, t.trial.name.size());
    Draw(true);
  }

  void OnTrialUpdate(size_t index, const TrialResult& result) override {
    const bool state_changed = trials_[index].state != result.state;
    trials_[index] = result;
    Draw(state_changed);
  }

  void OnMessage(const std::string& message) override {
    Erase();
    std::fprintf(out_, "%s\n", message.c_str());
    drawn_lines_ = 0;
    Draw(true);
  }

  void OnJobEnd(const std::vector<TrialResult>& trials) override {
    trials_ = trials;
    Draw(true);
  }

 private:
  void Erase() {
    for (int i = 0; i < drawn_lines_; ++i) std::fprintf(out_, "\x1b[1A\x1b[2K");
  }

  void Draw(bool force) {
    const auto now = Clock::now();
    if (!force && std::chrono::duration<double>(now - last_draw_).count() < min_interval_) return;
    last_draw_ = now;
    Erase();
    size_t done = 0;
    for (const auto& t : trials_) done += t.state == "Succeeded" || t.state == "EarlyStopped";
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    std::fprintf(out_, "\x1b[1m%s\x1b[0m  %zu/%zu trials done  elapsed %s\n", job_.c_str(), done,
                 trials_.size(), FormatDuration(elapsed).c_str());
    std::fprintf(out_, "  %-*s  %-11s  %-22s %11s  %7s  %7s  %9s  %7s\n",
                 static_cast<int>(name_width_), "trial", "state", "progress", "step", "loss", "val",
                 trials_.empty() || !IsImageTask(trials_.front().trial) ? "tok/s" : "img/s", "ETA");
    for (const auto& t : trials_) {
      const int64_t total = t.trial.training.steps;
      const double frac = total > 0 ? static_cast<double>(t.step) / static_cast<double>(total) : 0;
      const int filled = static_cast<int>(std::lround(frac * 20));
      std::string bar = "[" + std::string(filled, '#') + std::string(20 - filled, '.') + "]";
      const std::string state = IsWaitingAtLimit(t) ? "Waiting" : t.state;
      const char* color = t.state == "Succeeded"      ? "\x1b[32m"
                          : t.state == "Failed"       ? "\x1b[31m"
                          : t.state == "EarlyStopped" ? "\x1b[36m"
                          : t.state == "Running"      ? "\x1b[33m"
                                                      : "";
      std::string step = std::to_string(t.step) + "/" + std::to_string(total);
      std::fprintf(out_, "  %-*s  %s%-11s\x1b[0m  %-22s %11s  %7s  %7s  %9s  %7s\n",
                   static_cast<int>(name_width_), t.trial.name.c_str(), color, state.c_str(),
                   bar.c_str(), step.c_str(), Num(t.last_loss, "%.4f").c_str(),
                   Num(t.val_curve.empty() ? NAN : t.val_curve.back().loss, "%.4f").c_str(),
                   Num(t.tokens_per_second, "%.0f").c_str(),
                   t.state == "Running" ? FormatDuration(t.eta_seconds).c_str() : "");
    }
    std::fflush(out_);
    drawn_lines_ = static_cast<int>(trials_.size()) + 2;
  }

  FILE* out_;
  double min_interval_;
  std::string job_;
  std::vector<TrialResult> trials_;
  size_t name_width_ = 5;
  Clock::time_point start_{};
  Clock::time_point last_draw_{};
  int drawn_lines_ = 0;
};

class LogProgress : public ProgressSinkInterface {
 public:
  LogProgress(FILE* out, double every_fraction) : out_(out), every_fraction_(every_fraction) {}

  void OnJobStart(const std::string& job, const std::vector<TrialResult>& trials) override {
    start_ = Clock::now();
    last_state_.assign(trials.size(), "");
    last_val_step_.assign(trials.size(), -1);
    last_step_logged_.assign(trials.size(), -1);
    Log("job " + job + ": " + std::to_string(trials.size()) + " trials");
  }

  void OnTrialUpdate(size_t i, const TrialResult& t) override {
    const int64_t total = t.trial.training.steps;
    const int64_t every = std::max<int64_t>(
        1, static_cast<int64_t>(std::llround(static_cast<double>(total) * every_fraction_)));
    if (t.state != last_state_[i]) {
      last_state_[i] = t.state;
      std::string line = t.trial.name + " " + t.state;
      if (t.state == "Running") {
        line += t.step > 0 ? " (resuming at step " + std::to_string(t.step) + ")" : "";
      } else if (t.state == "Succeeded") {
        line += ": val loss " + Num(t.final_val_loss, "%.4f") + ", train loss " +
                Num(t.final_train_loss, "%.4f") + ", " + Num(t.tokens_per_second, "%.0f") + " " +
                ThroughputUnit(t.trial) + ", " + FormatDuration(t.wall_seconds);
      } else if (!t.message.empty()) {
        line += ": " + t.message;
      }
      Log(line);
      return;
    }
    if (!t.val_curve.empty() && t.val_curve.back().step != last_val_step_[i]) {
      last_val_step_[i] = t.val_curve.back().step;
      Log(t.trial.name + " step " + std::to_string(t.step) + "/" + std::to_string(total) +
          " val loss " + Num(t.val_curve.back().loss, "%.4f") +
          (IsWaitingAtLimit(t) ? "; waits there for the other trials' results (early stopping)"
                               : ""));
    }
    if (t.state == "Running" && t.step % every == 0 && t.step != last_step_logged_[i]) {
      last_step_logged_[i] = t.step;
      Log(t.trial.name + " step " + std::to_string(t.step) + "/" + std::to_string(total) +
          " loss " + Num(t.last_loss, "%.4f") + " " + Num(t.tokens_per_second, "%.0f") + " " +
          ThroughputUnit(t.trial) + " ETA " + FormatDuration(t.eta_seconds));
    }
  }

  void OnMessage(const std::string& message) override { Log(message); }

  void OnJobEnd(const std::vector<TrialResult>& trials) override {
    size_t ok = 0, stopped = 0;
    for (const auto& t : trials) {
      ok += t.state == "Succeeded";
      stopped += t.state == "EarlyStopped";
    }
    Log(std::to_string(ok) + "/" + std::to_string(trials.size()) + " trials succeeded" +
        (stopped ? ", " + std::to_string(stopped) + " stopped early" : ""));
  }

 private:
  void Log(const std::string& line) {
    const double s = std::chrono::duration<double>(Clock::now() - start_).count();
    std::fprintf(out_, "[%8.1fs] %s\n", s, line.c_str());
    std::fflush(out_);
  }

  FILE* out_;
  double every_fraction_;
  Clock::time_point start_{};
  std::vector<std::string> last_state_;
  std::vector<int64_t> last_val_step_;
  std::vector<int64_t> last_step_logged_;
};

class QuietProgress : public ProgressSinkInterface {
 public:
  explicit QuietProgress(FILE* out) : out_(out) {}
  void OnJobStart(const std::string&, const std::vector<TrialResult>&) override {}
  void OnTrialUpdate(size_t, const TrialResult&) override {}
  void OnMessage(const std::string& message) override {
    std::fprintf(out_, "%s\n", message.c_str());
  }
  void OnJobEnd(const std::vector<TrialResult>&) override {}

 private:
  FILE* out_;
};

}  // namespace

std::unique_ptr<ProgressSinkInterface> MakeTerminalProgress(FILE* out, double redraw_hz) {
  return std::make_unique<TerminalProgress>(out, redraw_hz);
}

std::unique_ptr<ProgressSinkInterface> MakeLogProgress(FILE* out, double every_fraction) {
  return std::make_unique<LogProgress>(out, every_fraction);
}

std::unique_ptr<ProgressSinkInterface> MakeQuietProgress(FILE* out) {
  return std::make_unique<QuietProgress>(out);
}

}  // namespace hydra::cli
