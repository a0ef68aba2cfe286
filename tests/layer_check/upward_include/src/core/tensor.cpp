// core must not see nn.
#include "mha/nn/linear.h"
