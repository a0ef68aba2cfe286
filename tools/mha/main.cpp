// The mha command-line tool. Each subcommand lives in its own file; this file only wires them
// up and turns errors into one-line messages with a non-zero exit.
#include <CLI/CLI.hpp>

#include <cctype>
#include <csignal>
#include <exception>
#include <iostream>
#include <string>

#include "attention_command.h"
#include "bench_command.h"
#include "embed_command.h"
#include "eval_command.h"
#include "heatmap_command.h"
#include "tokenize_command.h"
#include "train_command.h"
#include "mha/core/error.h"
#include "mha/core/escape.h"

namespace {

// Every error is one line, so a script can show or log it as one: a line break and the
// indentation after it become a single space. Whatever the message quotes (a flag, a path, a
// name from a file) is then escaped, so nothing reaches the terminal raw.
std::string one_line(const std::string& message) {
  std::string out;
  for (size_t i = 0; i < message.size(); ++i) {
    if (message[i] != '\n' && message[i] != '\r') {
      out += message[i];
      continue;
    }
    while (i + 1 < message.size() && std::isspace(static_cast<unsigned char>(message[i + 1]))) ++i;
    if (i + 1 < message.size()) out += ' ';
  }
  return mha::escape(out);
}

}  // namespace

int main(int argc, char** argv) {
  // A write past the file-size limit (ulimit -f, RLIMIT_FSIZE) raises SIGXFSZ, whose default
  // action kills the process on the spot, leaving no message. Ignored, the write fails with EFBIG
  // instead, and the command reports "File too large" naming the file, like any other failed
  // write (mha/core/atomic_file.h).
  std::signal(SIGXFSZ, SIG_IGN);
  CLI::App app{"mha: multi-head attention, faithful to PyTorch, forward and backward."};
  // CLI11's own errors (unknown flag, bad value, missing option) in mha's one-line form, instead
  // of its default of the message and a second line about --help.
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return "mha: error: " + one_line(e.what()) + " (see --help)\n";
  });
  app.require_subcommand(1);
  mha::tools::add_attention_command(app);
  mha::tools::add_heatmap_command(app);
  mha::tools::add_tokenize_command(app);
  mha::tools::add_embed_command(app);
  mha::tools::add_bench_command(app);
  mha::tools::add_train_command(app);
  mha::tools::add_eval_command(app);
  app.footer(std::string("\n`mha attention --help` lists every flag.\n") + mha::tools::attention_contract());
  // CLI11 reports a mistyped command as a missing one; name it instead.
  if (argc > 1 && argv[1][0] != '-') {
    std::string commands;
    bool known = false;
    for (const CLI::App* command : app.get_subcommands([](CLI::App*) { return true; })) {
      known = known || command->check_name(argv[1]);
      commands += (commands.empty() ? "" : ", ") + command->get_name();
    }
    if (!known) {
      std::cerr << "mha: error: unknown command '" << one_line(argv[1]) << "' (commands: " << commands << ")\n";
      return static_cast<int>(CLI::ExitCodes::ExtrasError);
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const mha::Error& e) {
    std::cerr << "mha: error: " << one_line(e.what()) << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "mha: internal error: " << one_line(e.what()) << "\n";
    return 2;
  }
  return 0;
}
