// nn must use attention through its public API.
#include "../attention/problem.h"
