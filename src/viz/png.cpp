// write_png and read_png: the only place mha talks to libpng.
//
// libpng reports errors by calling an error function that must not return; the classic API
// needs setjmp/longjmp for that, which skips C++ destructors. libpng's simplified API
// (png_image_*) does the setjmp itself and comes back with a return code and a message, so no
// libpng error can abort the process or unwind through C++ frames.
#include <png.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "mha/core/atomic_file.h"
#include "mha/core/error.h"
#include "mha/viz/heatmap.h"

namespace mha::viz {
namespace {

void check_image(const Image& image) {
  check(image.width >= 1 && image.width <= kMaxImageSide && image.height >= 1 && image.height <= kMaxImageSide,
        "write_png: image: expected width and height in 1..", kMaxImageSide, ", got ", image.width, " x ",
        image.height);
  const size_t expected = static_cast<size_t>(image.width) * static_cast<size_t>(image.height) * 3;
  check(image.rgb.size() == expected, "write_png: image.rgb: expected width * height * 3 = ", expected,
        " bytes, got ", image.rgb.size());
}

// Encodes into an open FILE; throws on a libpng or stdio error (the caller closes the FILE).
void encode(std::FILE* file, const Image& image, const std::string& path) {
  png_image png{};
  png.version = PNG_IMAGE_VERSION;
  png.width = static_cast<png_uint_32>(image.width);
  png.height = static_cast<png_uint_32>(image.height);
  png.format = PNG_FORMAT_RGB;
  const int ok = png_image_write_to_stdio(&png, file, /*convert_to_8_bit=*/0, image.rgb.data(),
                                          /*row_stride=*/image.width * 3, /*colormap=*/nullptr);
  // A failed fwrite is only "Write Error" to libpng; the system's reason ("No space left on
  // device", "File too large") is in errno, taken before anything else can change it.
  const int write_error = std::ferror(file) ? errno : 0;
  const std::string message = png.message;  // copied before png_image_free clears the struct
  png_image_free(&png);
  check(write_error == 0, "write_png: cannot write '", path, "': ", std::strerror(write_error));
  check(ok != 0, "write_png: cannot write '", path, "': libpng: ", message);
}

}  // namespace

void write_png(const std::string& path, const Image& image) {
  // Validate first: a bad image must not touch the disk at all.
  check_image(image);
  write_file_atomically(path, "write_png", [&](std::FILE* file) { encode(file, image, path); });
}

Image read_png(const std::string& path) {
  png_image png{};
  png.version = PNG_IMAGE_VERSION;
  check(png_image_begin_read_from_file(&png, path.c_str()) != 0, "read_png: cannot read '", path,
        "': libpng: ", png.message);
  // From here on, every exit must free the png_image (it owns the open FILE).
  if (png.width < 1 || png.width > kMaxImageSide || png.height < 1 || png.height > kMaxImageSide) {
    const std::string message = detail::concat("read_png: '", path, "': expected width and height in 1..",
                                               kMaxImageSide, ", got ", png.width, " x ", png.height);
    png_image_free(&png);
    throw Error(message);
  }
  png.format = PNG_FORMAT_RGB;
  Image image;
  image.width = static_cast<int>(png.width);
  image.height = static_cast<int>(png.height);
  image.rgb.resize(PNG_IMAGE_SIZE(png));
  const png_color white = {255, 255, 255};
  const int ok = png_image_finish_read(&png, &white, image.rgb.data(), /*row_stride=*/0, /*colormap=*/nullptr);
  const std::string message = png.message;
  png_image_free(&png);  // finish_read frees on success too; a second free is harmless
  check(ok != 0, "read_png: cannot read '", path, "': libpng: ", message);
  return image;
}

}  // namespace mha::viz
