// Compile-time sizes of the network's kernels. load_module prepends the run's values as
// #defines (foxhunt_core/gpu/launch.py: branch_defines); defines.cuh's defaults (the table in
// foxhunt_core/gpu/defines.py) only let a file compile on its own (nvcc -ptx, the CI check).
//   NUM_ATOMS        N, atoms per distribution
//   NUM_ACTIONS      A, actions over all branches
//   NUM_BRANCHES     D
//   BRANCH_OFFSETS   {o_0, ..., o_D}: branch d owns actions [o_d, o_{d+1})
//   MAX_BRANCH_SIZE  the largest o_{d+1} - o_d
//   BRANCH_OF_ACTION {d(0), ..., d(A-1)}: the branch of each action
#pragma once

#include "defines.cuh"
