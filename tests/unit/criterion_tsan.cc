// criterion_tsan.cc — linked into the unit binaries of the ThreadSanitizer
// build only (make SAN=thread), so that Criterion can start under TSan.
//
// Criterion's sandbox (BoxFort) maps its "inheritable arena" with MAP_FIXED
// at 0x200000000000 + rand_r() * 16 MiB, a range that under TSan is almost
// all shadow and meta memory: every try fails, and the runner dies with
// "Could not initialize inheritable arena" (Criterion issue #274). Its only
// source of addresses is rand_r, so this rand_r hands out addresses in
// 0x566000000000..0x567000000000 instead: application memory for TSan
// (its x86_64 "mid app" range, 0x550000000000-0x568000000000), above where
// the kernel places a PIE binary and its heap (0x555555554000 plus at most
// 1 TiB with vm.mmap_rnd_bits = 28), so the MAP_FIXED that maps the same
// address again in each test's process finds it free.
//
// Nothing else in the unit tests calls rand_r. Not for other builds: there
// the arena's own choice works.
extern "C" int rand_r(unsigned* seed) {
  (void)seed;
  static unsigned next = 0;
  // (0x566000000000 - 0x200000000000) / 16 MiB, then one 16 MiB step per
  // call: BoxFort calls again when the address it drew is taken.
  unsigned n = __atomic_fetch_add(&next, 1, __ATOMIC_RELAXED);
  return static_cast<int>(0x366000u + (n & 0xfffu));
}
