// Placeholder until the trainer lands: registers nothing.
#include "command.h"

std::vector<RegisteredCommand> add_train_commands(CLI::App*) { return {}; }
