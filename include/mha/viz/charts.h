#pragma once
// Pictures of a training run, as PNG (through write_png, so written atomically):
//   - training curves: loss and accuracy per epoch, train and test, in two panels;
//   - a confusion matrix: counts of (true class, predicted class), each row shaded by the
//     fraction of that class predicted so, with the class names along both axes.
#include <cstdint>
#include <string>
#include <vector>

#include "mha/viz/heatmap.h"

namespace mha::viz {

struct TrainingCurves {
  // One value per epoch (epoch 1 first); all four the same length, >= 1. Accuracies in [0, 1].
  std::vector<double> train_loss, test_loss, train_accuracy, test_accuracy;
  std::string title;  // optional line above the panels
};

// Throws mha::Error naming the series when lengths differ, a series is empty or a value is not
// finite (or an accuracy is outside [0, 1]).
Image render_training_curves(const TrainingCurves& curves);
void write_training_curves(const std::string& path, const TrainingCurves& curves);

// counts: classes² values, row = true class, column = predicted class, each >= 0.
// class_names: empty (then "0", "1", ...) or exactly `classes` names.
Image render_confusion_matrix(const std::vector<int64_t>& counts, int64_t classes,
                              const std::vector<std::string>& class_names = {}, const std::string& title = "");
void write_confusion_matrix(const std::string& path, const std::vector<int64_t>& counts, int64_t classes,
                            const std::vector<std::string>& class_names = {}, const std::string& title = "");

}  // namespace mha::viz
