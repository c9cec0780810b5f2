// Compile-time sizes of the network's kernels. load_module prepends the run's values as
// #defines (foxhunt_core/gpu/launch.py: DEFAULT_DEFINES, branch_defines); these defaults, equal
// to DEFAULT_DEFINES, only let a file compile on its own (nvcc -ptx, the CI check).
//   NUM_ATOMS        N, atoms per distribution
//   NUM_ACTIONS      A, actions over all branches
//   NUM_BRANCHES     D
//   BRANCH_OFFSETS   {o_0, ..., o_D}: branch d owns actions [o_d, o_{d+1})
//   MAX_BRANCH_SIZE  the largest o_{d+1} - o_d
//   BRANCH_OF_ACTION {d(0), ..., d(A-1)}: the branch of each action
#pragma once

#ifndef NUM_ATOMS
#define NUM_ATOMS 51
#endif
#ifndef NUM_ACTIONS
#define NUM_ACTIONS 12
#endif
#ifndef NUM_BRANCHES
#define NUM_BRANCHES 4
#endif
#ifndef BRANCH_OFFSETS
#define BRANCH_OFFSETS {0, 3, 6, 9, 12}
#endif
#ifndef MAX_BRANCH_SIZE
#define MAX_BRANCH_SIZE 3
#endif
#ifndef BRANCH_OF_ACTION
#define BRANCH_OF_ACTION {0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3}
#endif
