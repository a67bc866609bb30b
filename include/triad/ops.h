#pragma once

// The op front end: free functions that validate, dispatch to a Backend and
// record autograd.
#include "triad/ops/creation.h"
#include "triad/ops/elementwise.h"
#include "triad/ops/linalg.h"
#include "triad/ops/nn_functional.h"
#include "triad/ops/reduce.h"
#include "triad/ops/shape_ops.h"
