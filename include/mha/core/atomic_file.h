#pragma once
// Files are written atomically: into a temporary file next to the target, flushed to disk, then
// renamed over it. Readers see the old file or the whole new one, never a partial one, and on
// any failure the temporary file is removed and nothing is left behind.
#include <cstdio>
#include <functional>
#include <string>

namespace mha {

// Calls write(file) on the temporary file; `what` prefixes error messages (mha::Error), e.g.
// "safetensors: cannot save 'out.safetensors': ...". write may throw; the file is cleaned up.
void write_file_atomically(const std::string& path, const std::string& what,
                           const std::function<void(std::FILE*)>& write);

}  // namespace mha
