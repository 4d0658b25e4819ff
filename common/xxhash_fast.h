// xxhash_fast.h — libxxhash's XXH3 through the library's own x86 dispatch:
// the XXH3_* calls become the *_dispatch entry points of the same library,
// which pick AVX2 or AVX-512 at run time when the CPU has them (the plain
// symbols are built for the x86-64 baseline, SSE2). The values are the same
// (the checksum is defined by XXH3, not by how it is computed); the content
// checksum of a drained file took 0.076 s a GiB in SSE2 and 0.027 s with
// the dispatch on this VM's EPYC (docs/benchmarks.md, "Stop 53: the step
// beside the drain again").
// Include it instead of <xxhash.h> where bytes of files are hashed.
#pragma once

#include <xxhash.h>

#if defined(__x86_64__) || defined(__i386__)
#include <xxh_x86dispatch.h>
#endif
