// A test must go through public headers.
#include "../../src/nn/internal.h"
