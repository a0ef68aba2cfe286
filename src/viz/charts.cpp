#include "mha/viz/charts.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <string_view>

#include "mha/core/error.h"
#include "mha/viz/font.h"
#include "canvas.h"

namespace mha::viz {
namespace {

using detail::Canvas;
using detail::Colour;
constexpr Colour kWhite = {255, 255, 255};
constexpr Colour kInk = {34, 34, 34};
constexpr Colour kGrid = {225, 225, 225};
constexpr Colour kAxis = {120, 120, 120};
constexpr Colour kTrainColour = {31, 119, 180};  // matplotlib's first two colours
constexpr Colour kTestColour = {255, 127, 14};


int text_width(std::string_view s, int scale) { return font::text_width(s.size()) * scale; }

std::string format(double v, int decimals) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*f", decimals, v);
  return buffer;
}

// A "nice" tick step (1, 2 or 5 times a power of ten) giving about `target` intervals.
double nice_step(double range, int target) {
  const double raw = range / target, power = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * power >= raw) return m * power;
  return 10 * power;
}

int decimals_for(double step) { return std::max(0, static_cast<int>(-std::floor(std::log10(step) + 1e-9))); }

struct Panel {
  int x, y, w, h;  // the plot area
  double y_min, y_max;
  int epochs;
  int px(int epoch) const {  // epoch 1..epochs
    return epochs == 1 ? x + w / 2 : x + static_cast<int>(std::lround((epoch - 1) * (w - 1.0) / (epochs - 1)));
  }
  int py(double v) const { return y + h - 1 - static_cast<int>(std::lround((v - y_min) / (y_max - y_min) * (h - 1))); }
};

void draw_panel(Canvas& canvas, const Panel& p, const std::string& title, double scale_factor, int value_decimals_extra,
                const std::vector<double>& train, const std::vector<double>& test, const char* unit) {
  // Horizontal grid lines and value labels.
  const double step = nice_step(p.y_max - p.y_min, 5);
  const int decimals = decimals_for(step * scale_factor) + value_decimals_extra;
  for (double v = std::ceil(p.y_min / step - 1e-9) * step; v <= p.y_max + 1e-9 * step; v += step) {
    if (std::abs(v) < 1e-9 * step) v = 0;  // no "-0.0"
    const int y = p.py(v);
    canvas.fill(p.x, y, p.w, 1, kGrid);
    const std::string label = format(v * scale_factor, std::max(0, decimals));
    canvas.text(p.x - 6 - text_width(label, 1), y - 3, label, 1, kInk);
  }
  // Epoch ticks: at most ~12 labels.
  const int every = std::max(1, (p.epochs + 11) / 12);
  for (int e = 1; e <= p.epochs; ++e) {
    const int x = p.px(e);
    canvas.fill(x, p.y + p.h, 1, 4, kAxis);
    if ((e - 1) % every == 0 || e == p.epochs) {
      const std::string label = std::to_string(e);
      canvas.text(x - text_width(label, 1) / 2, p.y + p.h + 7, label, 1, kInk);
    }
  }
  canvas.fill(p.x, p.y + p.h, p.w, 1, kAxis);
  canvas.fill(p.x - 1, p.y, 1, p.h + 1, kAxis);
  canvas.text(p.x + p.w / 2 - text_width("epoch", 1) / 2, p.y + p.h + 20, "epoch", 1, kInk);
  canvas.text(p.x + (p.w - text_width(title, 2)) / 2, p.y - 28, title, 2, kInk);
  // Series: lines with square markers.
  for (const auto* series : {&train, &test}) {
    const Colour& c = series == &train ? kTrainColour : kTestColour;
    for (int e = 1; e <= p.epochs; ++e) {
      const double v = std::clamp((*series)[static_cast<size_t>(e - 1)], p.y_min, p.y_max);
      if (e > 1) {
        const double prev = std::clamp((*series)[static_cast<size_t>(e - 2)], p.y_min, p.y_max);
        canvas.line(p.px(e - 1), p.py(prev), p.px(e), p.py(v), c, 2);
      }
      canvas.fill(p.px(e) - 2, p.py(v) - 2, 5, 5, c);
    }
  }
  // Legend with the last values.
  int ly = p.y + 8;
  for (const auto* series : {&train, &test}) {
    const Colour& c = series == &train ? kTrainColour : kTestColour;
    const std::string label = std::string(series == &train ? "train " : "test  ") +
                              format(series->back() * scale_factor, std::max(2, decimals + 1)) + unit;
    const int lx = p.x + p.w - 12 - text_width(label, 1) - 22;
    canvas.fill(lx, ly + 3, 16, 2, c);
    canvas.text(lx + 22, ly, label, 1, kInk);
    ly += 14;
  }
}

void check_series(const std::vector<double>& v, size_t n, const char* name, bool probability) {
  check(v.size() == n, "training curves: ", name, ": expected ", n, " values (one per epoch), got ", v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    check(std::isfinite(v[i]), "training curves: ", name, "[", i, "]: expected a finite value, got ", v[i]);
    check(!probability || (v[i] >= 0 && v[i] <= 1), "training curves: ", name, "[", i,
          "]: expected an accuracy in [0, 1], got ", v[i]);
  }
}

}  // namespace

Image render_training_curves(const TrainingCurves& c) {
  const size_t n = c.train_loss.size();
  check(n >= 1, "training curves: train_loss: expected at least one epoch, got none");
  check(n <= 100000, "training curves: expected at most 100000 epochs, got ", n);
  check_series(c.train_loss, n, "train_loss", false);
  check_series(c.test_loss, n, "test_loss", false);
  check_series(c.train_accuracy, n, "train_accuracy", true);
  check_series(c.test_accuracy, n, "test_accuracy", true);

  const int top = c.title.empty() ? 48 : 80, panel_w = 420, panel_h = 280, left = 64, gap = 96;
  Canvas canvas(left + 2 * panel_w + gap + 24, top + panel_h + 48);
  if (!c.title.empty()) {
    const std::string title = font::printable(c.title, 100);
    canvas.text(16, 16, title, 2, kInk);
  }
  const int epochs = static_cast<int>(n);
  double loss_max = 0;
  for (const auto* v : {&c.train_loss, &c.test_loss})
    for (double x : *v) loss_max = std::max(loss_max, x);
  if (loss_max <= 0) loss_max = 1;
  const double loss_top = nice_step(loss_max, 5) * std::ceil(loss_max * 1.05 / nice_step(loss_max, 5));
  double acc_min = 1;
  for (const auto* v : {&c.train_accuracy, &c.test_accuracy})
    for (double x : *v) acc_min = std::min(acc_min, x);
  const double acc_bottom = std::max(0.0, std::floor((acc_min - 0.02) * 20) / 20);  // multiples of 5%
  const Panel loss{left, top, panel_w, panel_h, 0.0, loss_top, epochs};
  const Panel accuracy{left + panel_w + gap, top, panel_w, panel_h, acc_bottom, 1.0, epochs};
  draw_panel(canvas, loss, "loss (cross-entropy)", 1.0, 0, c.train_loss, c.test_loss, "");
  draw_panel(canvas, accuracy, "accuracy (%)", 100.0, 0, c.train_accuracy, c.test_accuracy, "%");
  return canvas.take();
}

void write_training_curves(const std::string& path, const TrainingCurves& curves) {
  write_png(path, render_training_curves(curves));
}

Image render_confusion_matrix(const std::vector<int64_t>& counts, int64_t classes,
                              const std::vector<std::string>& class_names, const std::string& title) {
  check(classes >= 1 && classes <= 100, "confusion matrix: classes: expected 1 to 100, got ", classes);
  check(static_cast<int64_t>(counts.size()) == classes * classes, "confusion matrix: counts: expected ",
        classes * classes, " values (classes²), got ", counts.size());
  check(class_names.empty() || static_cast<int64_t>(class_names.size()) == classes,
        "confusion matrix: class_names: expected none or ", classes, ", got ", class_names.size());
  for (size_t i = 0; i < counts.size(); ++i)
    check(counts[i] >= 0, "confusion matrix: counts[", i, "]: expected >= 0, got ", counts[i]);
  std::vector<std::string> names;
  for (int64_t k = 0; k < classes; ++k)
    names.push_back(class_names.empty() ? std::to_string(k) : font::printable(class_names[static_cast<size_t>(k)], 16));

  int64_t largest = 0, total = 0, correct = 0;
  for (int64_t v : counts) largest = std::max(largest, v);
  for (int64_t k = 0; k < classes; ++k) correct += counts[static_cast<size_t>(k * classes + k)];
  for (int64_t v : counts) total += v;
  const int digits = static_cast<int>(std::to_string(largest).size());
  const int cell = std::max(36, text_width(std::string(static_cast<size_t>(digits), '0'), 1) + 8);
  int label_w = 0;
  for (const auto& s : names) label_w = std::max(label_w, text_width(s, 1));
  const int grid = static_cast<int>(classes) * cell;
  const int title_h = title.empty() ? 0 : 32;
  const int left = 16 + 14 + label_w + 8, top = 16 + title_h + 14 + label_w + 8;
  const std::string summary =
      "accuracy " +
      format(total > 0 ? 100.0 * static_cast<double>(correct) / static_cast<double>(total) : 0.0, 2) + "% of " +
      std::to_string(total) + "; rows: true class, shade: fraction of the row";
  const std::string printable_title = font::printable(title, 100);
  const int width = std::max({left + grid + 24, left + text_width(summary, 1) + 16,
                              32 + text_width(printable_title, 2)});
  Canvas canvas(width, top + grid + 40);
  if (!title.empty()) canvas.text(16, 16, printable_title, 2, kInk);
  canvas.text(left + grid / 2 - text_width("predicted class", 1) / 2, 16 + title_h, "predicted class", 1, kInk);
  canvas.text_up(16, top + grid / 2 + text_width("true class", 1) / 2, "true class", 1, kInk);

  for (int64_t r = 0; r < classes; ++r) {
    int64_t row_total = 0;
    for (int64_t c = 0; c < classes; ++c) row_total += counts[static_cast<size_t>(r * classes + c)];
    for (int64_t c = 0; c < classes; ++c) {
      const int64_t v = counts[static_cast<size_t>(r * classes + c)];
      const double f = row_total > 0 ? static_cast<double>(v) / static_cast<double>(row_total) : 0.0;
      // White → dark blue; the diagonal in blue, errors in red, so mistakes stand out.
      const Colour full = r == c ? Colour{8, 69, 148} : Colour{178, 24, 43};
      const double t = std::sqrt(f);  // small error rates stay visible
      Colour colour;
      for (size_t i = 0; i < 3; ++i) colour[i] = static_cast<uint8_t>(std::lround(255 + (full[i] - 255.0) * t));
      const int x = left + static_cast<int>(c) * cell, y = top + static_cast<int>(r) * cell;
      canvas.fill(x, y, cell - 1, cell - 1, colour);
      const std::string label = std::to_string(v);
      canvas.text(x + (cell - 1 - text_width(label, 1)) / 2, y + (cell - 1 - font::kCapHeight) / 2, label, 1,
                  t > 0.55 ? kWhite : kInk);
    }
    const std::string& name = names[static_cast<size_t>(r)];
    canvas.text(left - 8 - text_width(name, 1), top + static_cast<int>(r) * cell + (cell - font::kCapHeight) / 2,
                name, 1, kInk);
    canvas.text_up(left + static_cast<int>(r) * cell + (cell - font::kCapHeight) / 2, top - 8, name, 1, kInk);
  }
  canvas.text(left, top + grid + 14, summary, 1, kInk);
  return canvas.take();
}

void write_confusion_matrix(const std::string& path, const std::vector<int64_t>& counts, int64_t classes,
                            const std::vector<std::string>& class_names, const std::string& title) {
  write_png(path, render_confusion_matrix(counts, classes, class_names, title));
}

}  // namespace mha::viz
