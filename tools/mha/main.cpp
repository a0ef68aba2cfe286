// The mha command-line tool. Each subcommand lives in its own file; this file only wires them
// up and turns errors into one-line messages with a non-zero exit.
#include <CLI/CLI.hpp>

#include <exception>
#include <iostream>
#include <string>

#include "attention_command.h"
#include "bench_command.h"
#include "eval_command.h"
#include "heatmap_command.h"
#include "train_command.h"
#include "mha/core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"mha: multi-head attention, faithful to PyTorch, forward and backward."};
  app.require_subcommand(1);
  mha::tools::add_attention_command(app);
  mha::tools::add_heatmap_command(app);
  mha::tools::add_bench_command(app);
  mha::tools::add_train_command(app);
  mha::tools::add_eval_command(app);
  app.footer(std::string("\n`mha attention --help` lists every flag.\n") + mha::tools::attention_contract());
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const mha::Error& e) {
    std::cerr << "mha: error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "mha: internal error: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
