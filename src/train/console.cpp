#include "triad/train/console.h"

#include <spdlog/sinks/ansicolor_sink.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <string>

#include "triad/core/error.h"
#include "triad/dist/world.h"

namespace triad::train {

ConsoleColor console_color(const char* (*getenv)(const char*)) {
  if (const char* asked = getenv("TRIAD_LOG_COLOR"); asked && *asked) {
    const std::string v = asked;
    if (v == "always") return ConsoleColor::Always;
    if (v == "never") return ConsoleColor::Never;
    if (v != "auto") {
      throw ConfigError("TRIAD_LOG_COLOR ('" + v +
                        "') must be always, never or auto (colour on a terminal, never under "
                        "NO_COLOR, TERM=dumb or an MPI launcher)");
    }
  }
  if (const char* no = getenv("NO_COLOR"); no && *no) return ConsoleColor::Never;
  if (const char* term = getenv("TERM"); term && std::string(term) == "dumb")
    return ConsoleColor::Never;
  if (dist::mpi_launched(getenv)) return ConsoleColor::Never;
  return ConsoleColor::Terminal;
}

void configure_console_colors() {
  const ConsoleColor c =
      console_color([](const char* name) -> const char* { return std::getenv(name); });
  const spdlog::color_mode mode = c == ConsoleColor::Always  ? spdlog::color_mode::always
                                  : c == ConsoleColor::Never ? spdlog::color_mode::never
                                                             : spdlog::color_mode::automatic;
  spdlog::apply_all([mode](const std::shared_ptr<spdlog::logger>& logger) {
    for (const auto& sink : logger->sinks()) {
      using Multi = spdlog::sinks::ansicolor_sink<spdlog::details::console_mutex>;
      using Single = spdlog::sinks::ansicolor_sink<spdlog::details::console_nullmutex>;
      if (auto* s = dynamic_cast<Multi*>(sink.get())) s->set_color_mode(mode);
      if (auto* s = dynamic_cast<Single*>(sink.get())) s->set_color_mode(mode);
    }
  });
}

}  // namespace triad::train
