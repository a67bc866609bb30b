#pragma once
// Colour in the console's log lines: on a terminal, off in a file, off
// under a launcher (whose ranks' output cannot be told from a terminal's).

namespace triad::train {

enum class ConsoleColor {
  Terminal,  // where the stream is a terminal (spdlog's own test, isatty)
  Always,
  Never,
};

// What the environment (`getenv`) asks for: TRIAD_LOG_COLOR=always | never |
// auto (auto or unset: what follows; any other value is a ConfigError);
// Never where NO_COLOR is set and not empty (no-color.org), TERM is "dumb",
// or an MPI launcher started the process (dist::mpi_launched: Open MPI
// gives each rank a pseudo-terminal even when mpirun's own output goes to a
// file, so the test for a terminal would say yes there); else Terminal.
ConsoleColor console_color(const char* (*getenv)(const char*));

// Sets every console sink of every spdlog logger registered now (the
// default logger's included) to console_color(std::getenv). The example
// programs call it at start-up, after creating their loggers; the library
// itself leaves a program's logging as the program set it.
void configure_console_colors();

}  // namespace triad::train
