#include "triad/train/console.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ansicolor_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <map>
#include <string>

#include "support/expect_error.h"
#include "support/scoped_env.h"

namespace triad::train {
namespace {

using testing::ScopedEnv;

// The environment console_color reads, one case at a time.
std::map<std::string, std::string>& console_env() {
  static std::map<std::string, std::string> env;
  return env;
}
const char* console_getenv(const char* name) {
  const auto it = console_env().find(name);
  return it == console_env().end() ? nullptr : it->second.c_str();
}
ConsoleColor color_with(std::map<std::string, std::string> env) {
  console_env() = std::move(env);
  return console_color(console_getenv);
}

TEST(ConsoleColor, ATerminalDecidesUnlessSomethingSaysOtherwise) {
  EXPECT_EQ(color_with({}), ConsoleColor::Terminal);
  EXPECT_EQ(color_with({{"TERM", "xterm-256color"}, {"NO_COLOR", ""}}), ConsoleColor::Terminal);
  EXPECT_EQ(color_with({{"TRIAD_LOG_COLOR", "auto"}}), ConsoleColor::Terminal);
  EXPECT_EQ(color_with({{"NO_COLOR", "1"}}), ConsoleColor::Never);
  EXPECT_EQ(color_with({{"TERM", "dumb"}}), ConsoleColor::Never);
  // A launcher's ranks (Open MPI gives them pseudo-terminals), srun's too.
  EXPECT_EQ(color_with({{"OMPI_COMM_WORLD_SIZE", "8"}}), ConsoleColor::Never);
  EXPECT_EQ(color_with({{"SLURM_PROCID", "0"}}), ConsoleColor::Never);
  EXPECT_EQ(color_with({{"TRIAD_LOG_COLOR", "auto"}, {"PMIX_RANK", "3"}}), ConsoleColor::Never);
}

TEST(ConsoleColor, TriadLogColorWinsAndIsChecked) {
  EXPECT_EQ(color_with({{"TRIAD_LOG_COLOR", "always"}, {"OMPI_COMM_WORLD_SIZE", "2"}}),
            ConsoleColor::Always);
  EXPECT_EQ(color_with({{"TRIAD_LOG_COLOR", "always"}, {"NO_COLOR", "1"}}), ConsoleColor::Always);
  EXPECT_EQ(color_with({{"TRIAD_LOG_COLOR", "never"}, {"TERM", "xterm"}}), ConsoleColor::Never);
  testing::expect_error<ConfigError>(
      [] {
        color_with({{"TRIAD_LOG_COLOR", "yes"}});
      },
      {"TRIAD_LOG_COLOR ('yes')", "always, never or auto"});
  testing::expect_error<ConfigError>([] { color_with({{"TRIAD_MPI", "2"}}); }, {"TRIAD_MPI"});
}

bool colors(const std::shared_ptr<spdlog::logger>& logger) {
  using Sink = spdlog::sinks::ansicolor_sink<spdlog::details::console_mutex>;
  return dynamic_cast<Sink&>(*logger->sinks().at(0)).should_color();
}

TEST(ConsoleColor, EveryRegisteredLoggersConsoleSinksFollowTheEnvironment) {
  auto tool = spdlog::stderr_color_mt("console_test_tool");
  const auto fallback = spdlog::default_logger();
  ScopedEnv ask("TRIAD_LOG_COLOR", nullptr), no("NO_COLOR", nullptr), term("TERM", "xterm"),
      launcher("OMPI_COMM_WORLD_SIZE", nullptr);
  {
    ScopedEnv always("TRIAD_LOG_COLOR", "always");
    configure_console_colors();
    EXPECT_TRUE(colors(tool));
    EXPECT_TRUE(colors(fallback));
  }
  {
    ScopedEnv off("NO_COLOR", "1");
    configure_console_colors();
    EXPECT_FALSE(colors(tool));
    EXPECT_FALSE(colors(fallback));
  }
  {
    ScopedEnv ranks("OMPI_COMM_WORLD_SIZE", "4");
    ScopedEnv always("TRIAD_LOG_COLOR", "always");
    configure_console_colors();
    EXPECT_TRUE(colors(tool));
  }
  {
    ScopedEnv ranks("OMPI_COMM_WORLD_SIZE", "4");
    configure_console_colors();
    EXPECT_FALSE(colors(tool));
    EXPECT_FALSE(colors(fallback));
  }
  spdlog::drop("console_test_tool");
}

}  // namespace
}  // namespace triad::train
