/* A kernel file for manifest tests (never launched). */
extern "C" __global__ void fixture_kernel(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = 0.0f;
}
