#pragma once

// The record of verified products (cuda::GemmSettings::verify), kept in
// gemm_settings.cpp in every build and written by gemm_verification.cpp.
#include "triad/backend/cuda.h"

namespace triad::detail {

// Adds one check; true when it failed and is the first failure of its
// problem (the caller logs it).
bool record_gemm_check(const cuda::GemmCheck& check);
// Counts a product that could not be checked.
void record_gemm_unchecked();

}  // namespace triad::detail
