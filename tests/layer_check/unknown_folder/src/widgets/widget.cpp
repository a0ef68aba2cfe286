#include "mha/core/tensor.h"
