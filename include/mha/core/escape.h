#pragma once
// Text from outside mha, made safe to print. A tensor name or metadata value from a downloaded
// file, a flag, a path, a token or another library's message can hold bytes a terminal acts on
// (ESC [2J clears the screen, ESC ]0;...BEL retitles the window) or bytes that are not UTF-8 at
// all; printed raw, a file could take over the user's terminal. escape() shows them instead.
#include <string>
#include <string_view>

namespace mha {

// `text` with everything a terminal could act on replaced by a visible escape:
//   - bytes that are not part of valid UTF-8 (stray continuation bytes, overlong or truncated
//     sequences, surrogates, > U+10FFFF) as \xNN, one per byte;
//   - control characters: \n, \r and \t as themselves written out, the other C0 controls and DEL
//     as \xNN, the C1 controls (U+0080 to U+009F: CSI, OSC, ...) as \uNNNN;
//   - the characters that move or reorder text (line and paragraph separators, bidirectional
//     overrides and isolates, as in "Trojan Source") as \uNNNN.
// Printable ASCII and every other valid UTF-8 character ("café", "注意") is kept as it is, and
// so are backslashes: escape(escape(x)) == escape(x), so a message built from escaped parts can
// be escaped again as a whole. keep_newlines leaves '\n' as a line break (multi-line messages).
std::string escape(std::string_view text, bool keep_newlines = false);

}  // namespace mha
