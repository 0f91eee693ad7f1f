// Placeholder until the long-context benchmark suite lands: registers nothing.
#include "command.h"

std::vector<RegisteredCommand> add_bench_suite_commands(CLI::App*) { return {}; }
