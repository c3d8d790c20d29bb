// Whether the CPU kernels are compiled once per instruction set and picked at run time
// (GCC's target attributes and __builtin_cpu_supports on x86-64), for prepare_cpu.h's row loops
// and gemm_cpu.cpp's products alike.
#pragma once

// GCC 12 is the first to take "arch=x86-64-vN" in target attributes and
// __builtin_cpu_supports: GCC 11 refused the sources ("no dispatcher found for the versioning
// attributes"), so older ones, like Clang, build the portable path.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#define GALERKIN_EXT_X86_CLONES 1
#else
#define GALERKIN_EXT_X86_CLONES 0
#endif
