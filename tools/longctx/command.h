// Subcommands defined outside main.cpp register themselves under a parent CLI11 app and hand
// back what to run when they are chosen.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <vector>

struct RegisteredCommand {
  CLI::App* app;              // the subcommand, as added to its parent
  std::function<int()> run;   // its exit code
};

// Benchmark-suite commands under `longctx bench` (tasks, run, ppl): cmd_bench_suite.cpp.
std::vector<RegisteredCommand> add_bench_suite_commands(CLI::App* bench);

// Training commands (`longctx train`, ...): cmd_train.cpp.
std::vector<RegisteredCommand> add_train_commands(CLI::App* app);

// `longctx methods` (the registries' methods and their keys): cmd_methods.cpp.
std::vector<RegisteredCommand> add_methods_commands(CLI::App* app);

// `longctx make-vocab` (a byte-level BPE vocabulary for train --vocab): cmd_vocab.cpp.
std::vector<RegisteredCommand> add_vocab_commands(CLI::App* app);

// `longctx read` (reading agents over a long document): cmd_read.cpp.
std::vector<RegisteredCommand> add_read_commands(CLI::App* app);

// `longctx serve` (the OpenAI-compatible HTTP server): cmd_serve.cpp.
std::vector<RegisteredCommand> add_serve_commands(CLI::App* app);

// `longctx bench serve` (the server under concurrent clients): cmd_bench_serve.cpp.
std::vector<RegisteredCommand> add_bench_serve_commands(CLI::App* bench);

// `longctx bench scale-model` (the cost model of context parallelism): cmd_dist.cpp.
std::vector<RegisteredCommand> add_dist_commands(CLI::App* bench);

// `longctx route` (an HTTP front over several `longctx serve` backends): cmd_dist.cpp.
std::vector<RegisteredCommand> add_route_commands(CLI::App* app);
