#pragma once
// The input of `mha tokenize` and `mha embed`: a text file of one sentence per line.
#include <string>
#include <vector>

namespace mha::models {

// The lines of `path` ("-": standard input), UTF-8. A line ends at '\n'; a '\r' just before it
// is dropped too (Windows line ends); a last line without '\n' counts, and an empty file has no
// lines. Every other byte is kept (a lone '\r' inside a line is the tokenizer's business: it is
// whitespace to it). Ill-formed UTF-8 is an mha::Error naming the file, the line (from 1) and the
// byte offset in the line (from 0); so is a file that cannot be read.
std::vector<std::string> read_lines(const std::string& path);

}  // namespace mha::models
