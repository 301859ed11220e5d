/* kernel_paths — prints the kernel paths (TD_KERNELS values) this build and CPU
 * support, the default first; tests/run.sh reruns the exactness tests on each. */
#include "nn/kernels.h"

#include <stdio.h>

int main(void) {
    static const char *names[TD_KPATH_COUNT] = {[TD_KPATH_PORTABLE] = "portable", [TD_KPATH_AVX512] = "avx512",
                                                [TD_KPATH_AVX2] = "avx2", [TD_KPATH_NEON] = "neon"};
    int best = td_kernels_path();
    printf("%s", names[best]);
    for (int p = 0; p < TD_KPATH_COUNT; p++)
        if (p != best && td_kernels_supported(p)) printf(" %s", names[p]);
    printf("\n");
    return 0;
}
