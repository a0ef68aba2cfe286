#pragma once
// Every file mha writes goes through write_file_atomically. What it guarantees:
//
// * Readers, and a process killed at any moment (SIGKILL, power loss), see the old file or the
//   whole new one at `path`, never a partial one. The new contents are written to a temporary
//   file in the target's directory, flushed and fsync'ed, then renamed over the target, and the
//   directory is fsync'ed so that the rename itself survives a crash.
// * A killed write leaves no debris. On Linux the temporary is created unnamed (O_TMPFILE): the
//   kernel frees it when the process dies. It gets a name (`<path>.tmp.<pid>.<n>`, by linkat
//   through /proc/self/fd, which needs no privilege) only once it is complete and synced, and
//   is renamed over the target at once; a kill in the microseconds between those two calls is
//   the one way to leave that name behind, and then it names a complete file. Where the file
//   system cannot make unnamed files, the temporary is named from the start (a kill while
//   writing leaves `<path>.tmp.<pid>.<n>` behind, partial; readers of `path` are unaffected).
// * Any failure (cannot create, write, flush, fsync, close, link or rename: full disk,
//   RLIMIT_FSIZE, no permission, no such directory) throws mha::Error "<what>: cannot write
//   '<path>': <reason>", <reason> being the system's (e.g. "No space left on device", "File too
//   large"); an exception from `write` passes through as it is. Either way nothing is left
//   behind: the target keeps its old contents, or stays absent, and no temporary file remains.
//   (One exception: when syncing the directory fails after the rename, the new file is in place
//   and the error says so; it may not survive a power loss.)
// * A target that exists and is not a regular file (a device such as /dev/null or /dev/full, a
//   FIFO, a socket, or a file named through /proc or /sys, as /dev/stdout and /dev/fd/N are) is
//   written directly, as a shell redirection would: opened without creating or truncating
//   anything, never with a temporary beside it, never renamed over. Errors are reported the
//   same way (ENOSPC from /dev/full; a directory is "Is a directory"); what was written before
//   the error is not taken back.
// * Symbolic links are followed: the file a link points to is replaced and the link is kept.
// * A new file gets the mode any new file gets (0666 less the umask); a replaced file's mode is
//   not carried over.
//
// A process that writes under a file-size limit (RLIMIT_FSIZE) should ignore SIGXFSZ, as the mha
// tool does, so that a write past the limit fails with EFBIG ("File too large") and comes back
// as an error instead of killing the process.
#include <cstdio>
#include <functional>
#include <string>

namespace mha {

// Calls write(file) with a FILE* open for writing (binary); `what` prefixes error messages, e.g.
// "safetensors: cannot write 'out.safetensors': No space left on device". write may throw (the
// file is cleaned up and the exception passes through) and need not check its own writes: a
// write error is caught afterwards from the FILE's error flag.
void write_file_atomically(const std::string& path, const std::string& what,
                           const std::function<void(std::FILE*)>& write);

namespace detail {
// How a regular file is written: `unnamed` (O_TMPFILE where the file system makes such files,
// otherwise `named`) is what write_file_atomically does; `named` always names the temporary
// from the start. For tests, which run the fallback on file systems where O_TMPFILE works.
enum class Temporary { unnamed, named };
void write_file_atomically(const std::string& path, const std::string& what,
                           const std::function<void(std::FILE*)>& write, Temporary temporary);
}  // namespace detail

}  // namespace mha
