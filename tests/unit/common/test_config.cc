// test_config.cc — parsing of user-supplied sizes and backend URLs (edge
// cases, overflow, credentials refused without echo), and the forms used in
// messages: byte counts, the URL's display form, redaction, escaped names.
#include <criterion/criterion.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "common/config.h"

using ckpt::BackendUrl;
using ckpt::HumanBytes;
using ckpt::ParseBackendUrl;
using ckpt::ParseSize;

namespace {

constexpr uint64_t kKiB = 1ull << 10, kMiB = 1ull << 20, kGiB = 1ull << 30, kTiB = 1ull << 40;

void ExpectSize(const char* in, uint64_t want) {
  auto r = ParseSize(in);
  cr_assert(r.has_value(), "ParseSize(\"%s\") failed: %s", in, r ? "" : r.error().c_str());
  cr_assert_eq(*r, want, "ParseSize(\"%s\") = %llu, want %llu", in, static_cast<unsigned long long>(*r),
               static_cast<unsigned long long>(want));
}

void ExpectBadSize(const std::string& in) {
  auto r = ParseSize(in);
  cr_assert(!r.has_value(), "ParseSize(\"%s\") accepted: %llu", in.c_str(),
            r ? static_cast<unsigned long long>(*r) : 0ull);
  cr_assert(!r.error().empty());
  cr_assert(r.error().find("'" + in + "'") != std::string::npos, "the message names the input: %s", r.error().c_str());
}

void ExpectPosix(const char* in, const char* path) {
  auto r = ParseBackendUrl(in);
  cr_assert(r.has_value(), "ParseBackendUrl(\"%s\") failed: %s", in, r ? "" : r.error().c_str());
  cr_assert(r->kind == BackendUrl::Kind::kPosix, "%s is a directory backend", in);
  cr_assert_str_eq(r->path.c_str(), path, "path of %s", in);
  cr_assert(r->bucket.empty() && r->prefix.empty());
}

void ExpectS3(const char* in, const char* bucket, const char* prefix) {
  auto r = ParseBackendUrl(in);
  cr_assert(r.has_value(), "ParseBackendUrl(\"%s\") failed: %s", in, r ? "" : r.error().c_str());
  cr_assert(r->kind == BackendUrl::Kind::kS3, "%s is an S3 backend", in);
  cr_assert_str_eq(r->bucket.c_str(), bucket, "bucket of %s", in);
  cr_assert_str_eq(r->prefix.c_str(), prefix, "prefix of %s", in);
  cr_assert(r->path.empty());
}

void ExpectBadUrl(const std::string& in, const char* why) {
  auto r = ParseBackendUrl(in);
  cr_assert(!r.has_value(), "ParseBackendUrl(\"%s\") accepted", in.c_str());
  cr_assert(r.error().find("'" + in + "'") != std::string::npos, "the message names the input: %s", r.error().c_str());
  cr_assert(r.error().find(why) != std::string::npos, "the message for '%s' says '%s': %s", in.c_str(), why,
            r.error().c_str());
}

// Compares whole strings (Criterion's str_eq keeps pointers into
// temporaries past their end).
void ExpectStr(const std::string& got, const std::string& want) {
  cr_assert(got == want, "got \"%s\", want \"%s\"", got.c_str(), want.c_str());
}

void ExpectHuman(uint64_t n, const char* want) {
  std::string got = HumanBytes(n);
  cr_assert(got == want, "HumanBytes(%llu) = \"%s\", want \"%s\"", static_cast<unsigned long long>(n), got.c_str(),
            want);
}

}  // namespace

Test(parse_size, plain_bytes_and_units) {
  ExpectSize("1", 1);
  ExpectSize("1073741824", kGiB);
  ExpectSize("10B", 10);
  ExpectSize("10b", 10);
  ExpectSize("1K", kKiB);
  ExpectSize("2KB", 2 * kKiB);
  ExpectSize("2KiB", 2 * kKiB);
  ExpectSize("512M", 512 * kMiB);
  ExpectSize("512m", 512 * kMiB);
  ExpectSize("512MB", 512 * kMiB);
  ExpectSize("512MiB", 512 * kMiB);
  ExpectSize("4G", 4 * kGiB);
  ExpectSize("4g", 4 * kGiB);
  ExpectSize("4GB", 4 * kGiB);
  ExpectSize("4gib", 4 * kGiB);
  ExpectSize("1T", kTiB);
  ExpectSize("3TiB", 3 * kTiB);
}

Test(parse_size, fractions) {
  ExpectSize("1.5GiB", 3 * kGiB / 2);
  ExpectSize("1.5G", 1610612736);
  ExpectSize("0.5K", 512);
  ExpectSize("0.25M", 256 * kKiB);
  ExpectSize("2.0M", 2 * kMiB);
  ExpectSize("1.5", 1);  // whole bytes, rounded down
}

Test(parse_size, percent_of_ram) {
  uint64_t mem = ckpt::PhysicalMemory();
  cr_assert_gt(mem, 0u);
  auto near = [](uint64_t got, double want) { return std::fabs(static_cast<double>(got) - want) <= 1.0; };
  auto q = ParseSize("25%");
  cr_assert(q.has_value(), "25%%: %s", q ? "" : q.error().c_str());
  cr_assert(near(*q, mem / 4.0), "25%% of %llu is %llu", static_cast<unsigned long long>(mem),
            static_cast<unsigned long long>(*q));
  cr_assert(near(*ParseSize("100%"), static_cast<double>(mem)));
  cr_assert(near(*ParseSize("50%"), mem / 2.0));
  cr_assert(near(*ParseSize("12.5%"), mem / 8.0));
  for (const char* bad : {"0%", "101%", "150%", "%", "-5%", "25%%", "25 %"}) {
    auto r = ParseSize(bad);
    cr_assert(!r.has_value(), "ParseSize(\"%s\") accepted", bad);
    cr_assert(r.error().find(bad) != std::string::npos, "message names %s: %s", bad, r.error().c_str());
  }
}

Test(parse_size, rejects_bad_strings) {
  for (const char* bad : {"",
                          "M",
                          "G1",
                          "abc",
                          "1X",
                          "12Q",
                          "1.2.3G",
                          "..",
                          ".",
                          "1 G",
                          " 1G",
                          "1G ",
                          "-1",
                          "+1",
                          "0",
                          "0B",
                          "0.1",
                          "0.4B",
                          "1e3",
                          "1E3",
                          "0x10",
                          "1GiBs",
                          "1KK",
                          "1 ",
                          "nan",
                          "inf",
                          "4Gb/s",
                          "1PB",
                          "99999999999T",
                          "8388608T",
                          "8000000T",
                          "1048577T",
                          "1GG",
                          "1G1",
                          "1.G",
                          ".5G",
                          "1..5G",
                          "--1",
                          "1-",
                          "18446744073709551616",
                          "99999999999999999999",
                          "1e",
                          "1%G",
                          "0.0",
                          "0M",
                          "00",
                          "0.0000001K"}) {
    ExpectBadSize(bad);
  }
  // The message also says what is expected.
  auto r = ParseSize("lots");
  cr_assert(r.error().find("512M") != std::string::npos, "%s", r.error().c_str());
  // The largest size accepted is 1 EiB (2^60 bytes), so that sums and the
  // x4 default of --max-file-size never overflow 64 bits.
  ExpectSize("1048576T", 1ull << 60);
  ExpectSize("1152921504606846976", 1ull << 60);
  ExpectBadSize("1152921504606846977");
  ExpectSize("1048575.5T", (1ull << 60) - kTiB / 2);
}

Test(parse_size, exact_integers) {
  // Integers are exact, not rounded through a double.
  ExpectSize("9007199254740993", 9007199254740993ull);
  ExpectSize("1125899906842623K", 1125899906842623ull * kKiB);
  ExpectSize("007", 7);
  ExpectSize("1.5G", 3 * kGiB / 2);
}

Test(parse_size, messages_are_one_line) {
  for (const char* bad : {"", "0", "1GG", "8000000T", "25%%", "-1"}) {
    auto r = ParseSize(bad);
    cr_assert(!r.has_value(), "ParseSize(\"%s\") accepted", bad);
    cr_assert(r.error().find('\n') == std::string::npos, "one line: %s", r.error().c_str());
  }
  auto e = ParseSize("");
  cr_assert(e.error().find("empty") != std::string::npos, "an empty size says so: %s", e.error().c_str());
}

Test(backend_url, directories) {
  ExpectPosix("/data/ckpt", "/data/ckpt");
  ExpectPosix("/data/ckpt/", "/data/ckpt");
  ExpectPosix("/data/ckpt///", "/data/ckpt");
  ExpectPosix("/", "/");
  ExpectPosix("//", "/");
  ExpectPosix("/with space/and:colon", "/with space/and:colon");
  ExpectPosix("file:///mnt/nfs/ckpt", "/mnt/nfs/ckpt");
  ExpectPosix("file:///mnt/nfs/ckpt/", "/mnt/nfs/ckpt");
  ExpectPosix("file:///", "/");
}

Test(backend_url, s3) {
  ExpectS3("s3://bucket/prefix", "bucket", "prefix");
  ExpectS3("s3://bucket/a/b/c", "bucket", "a/b/c");
  ExpectS3("s3://bucket/a/b/", "bucket", "a/b");
  ExpectS3("s3://bucket/a//", "bucket", "a");
  ExpectS3("s3://bucket/", "bucket", "");
  ExpectS3("s3://bucket", "bucket", "");
  ExpectS3("s3://my.bucket-1/x", "my.bucket-1", "x");
}

Test(backend_url, rejects) {
  ExpectBadUrl("", "absolute");
  ExpectBadUrl("relative/dir", "absolute");
  ExpectBadUrl("./dir", "absolute");
  ExpectBadUrl("~/ckpt", "absolute");
  ExpectBadUrl("file://relative", "absolute");
  ExpectBadUrl("file://", "absolute");
  ExpectBadUrl("s3://", "bucket");
  ExpectBadUrl("s3:///prefix", "bucket");
  ExpectBadUrl("http://host/x", "s3://");
  // Inside another mount's staging area or cluster records: its leftovers.
  ExpectBadUrl("/nfs/ckpts/.ckptfs-tmp", "keeps for itself");
  ExpectBadUrl("/nfs/ckpts/.ckptfs-tmp/mine/", "keeps for itself");
  ExpectBadUrl("file:///nfs/.ckptfs-cluster/x", "keeps for itself");
  ExpectBadUrl("s3://b/team/.ckptfs-tmp", "keeps for itself");
  ExpectBadUrl("s3://b/.ckptfs-cluster/x", "keeps for itself");
  ExpectPosix("/nfs/.ckptfs-tmpx/a.ckptfs-tmp", "/nfs/.ckptfs-tmpx/a.ckptfs-tmp");
  ExpectS3("s3://b/x.ckptfs-tmp/.ckptfs-clusters", "b", "x.ckptfs-tmp/.ckptfs-clusters");
  ExpectBadUrl("gs://bucket/x", "s3://");
  ExpectBadUrl("S3://bucket/x", "s3://");  // schemes are lower case
}

// header: "prefix, without leading/trailing '/'".
Test(backend_url, s3_prefix_without_leading_slash) {
  ExpectS3("s3://bucket//prefix", "bucket", "prefix");
  ExpectS3("s3://bucket///a/b//", "bucket", "a/b");
}

Test(human_bytes, formats) {
  ExpectHuman(0, "0 B");
  ExpectHuman(1, "1 B");
  ExpectHuman(1023, "1023 B");
  ExpectHuman(1024, "1.0 KiB");
  ExpectHuman(1536, "1.5 KiB");
  ExpectHuman(512 * kMiB, "512.0 MiB");
  ExpectHuman(3 * kGiB / 2, "1.5 GiB");
  ExpectHuman(4 * kGiB, "4.0 GiB");
  ExpectHuman(kTiB, "1.0 TiB");
  ExpectHuman(kTiB * 1024, "1.0 PiB");
  ExpectHuman(~0ull, "16384.0 PiB");  // no unit past PiB
}

Test(default_cache_size, quarter_of_ram_capped_by_tier_fs) {
  uint64_t mem = ckpt::PhysicalMemory();
  uint64_t d = ckpt::DefaultCacheSize("/dev/shm");
  cr_assert_gt(d, 0u);
  cr_assert_leq(d, mem / 4);
  // A directory that does not exist cannot cap it.
  cr_assert_eq(ckpt::DefaultCacheSize("/nonexistent/ckpt-unit"), mem / 4);
}

Test(default_cache_size, capped_by_what_is_available) {
  constexpr uint64_t G = 1ull << 30;
  cr_assert_eq(ckpt::CapToAvailable(6 * G, 20 * G, 0), 6 * G, "plenty available: unchanged");
  cr_assert_eq(ckpt::CapToAvailable(6 * G, 2 * G, 0), 2 * G, "capped at MemAvailable");
  cr_assert_eq(ckpt::CapToAvailable(6 * G, 2 * G, 3 * G), 5 * G, "what the tier holds is the tier's");
  cr_assert_eq(ckpt::CapToAvailable(6 * G, 0, 0), 6 * G, "unknown: no cap");
  uint64_t avail = ckpt::MemAvailable();
  cr_assert_gt(avail, 0u, "MemAvailable readable");
  cr_assert_leq(avail, ckpt::PhysicalMemory());
}

Test(backend_url, refuses_credentials_without_echo) {
  for (const char* url : {"s3://AKIAEXAMPLE:s3cr3t@bucket/prefix", "s3://AKIAEXAMPLE:s3cr3t%2Fx@bucket",
                          "s3://AKIAEXAMPLE:s3cr3t/x@bucket/p", "s3://AKIAEXAMPLE@bucket", "s3://:s3cr3t@bucket",
                          "file://user:s3cr3t@/data", "file://AKIAEXAMPLE@localhost/data",
                          "http://AKIAEXAMPLE:s3cr3t@host/x", "gs://AKIAEXAMPLE:s3cr3t@b/x"}) {
    auto r = ParseBackendUrl(url);
    cr_assert(!r.has_value(), "ParseBackendUrl(\"%s\") accepted", url);
    cr_assert(r.error().find("credentials in the backend URL are not accepted") != std::string::npos, "%s: %s", url,
              r.error().c_str());
    cr_assert(r.error().find("s3cr3t") == std::string::npos && r.error().find("AKIAEXAMPLE") == std::string::npos,
              "the message echoes the secret: %s", r.error().c_str());
  }
  // '@' in a path or prefix is not userinfo.
  ExpectS3("s3://bucket/team@x/run", "bucket", "team@x/run");
  ExpectPosix("/data/user:pw@host", "/data/user:pw@host");
  ExpectPosix("file:///data/a@b", "/data/a@b");
}

Test(backend_url, display_form) {
  auto s3 = ParseBackendUrl("s3://bucket/a/b/");
  cr_assert(s3.has_value());
  ExpectStr(ckpt::BackendDisplay(*s3, "s3://bucket/a/b/"), "s3://bucket/a/b");
  auto f = ParseBackendUrl("file:///data/x/");
  cr_assert(f.has_value());
  ExpectStr(ckpt::BackendDisplay(*f, "file:///data/x/"), "file:///data/x");
  auto p = ParseBackendUrl("/data/x");
  cr_assert(p.has_value());
  ExpectStr(ckpt::BackendDisplay(*p, "/data/x"), "/data/x");
}

Test(redact, userinfo_in_free_text) {
  using ckpt::RedactUserinfo;
  ExpectStr(RedactUserinfo("The following argument was not expected: s3://K:S@b/p"),
            "The following argument was not expected: s3://***@b/p");
  ExpectStr(RedactUserinfo("x http://u:p%2F@h:9/x y"), "x http://***@h:9/x y");
  ExpectStr(RedactUserinfo("s3://K:S/x@b"), "s3://***@b");
  ExpectStr(RedactUserinfo("s3://bucket/prefix"), "s3://bucket/prefix");
  ExpectStr(RedactUserinfo("no url @ here"), "no url @ here");
}

Test(escape_name, exact_bytes_recoverable) {
  using ckpt::EscapeName;
  ExpectStr(EscapeName("plain/name.pt"), "plain/name.pt");
  ExpectStr(EscapeName("caf\xc3\xa9"), "caf\xc3\xa9");  // valid UTF-8 stays
  ExpectStr(EscapeName("a\xff"
                       "b"),
            "a\\xffb");
  ExpectStr(EscapeName("l\nx\t\x1b[1m"), "l\\nx\\t\\x1b[1m");
  ExpectStr(EscapeName("back\\slash"), "back\\\\slash");
  ExpectStr(EscapeName("\xc3"), "\\xc3");                    // truncated sequence
  ExpectStr(EscapeName("\xed\xa0\x80"), "\\xed\\xa0\\x80");  // a surrogate is not UTF-8
  ExpectStr(EscapeName("\xc0\xaf"), "\\xc0\\xaf");           // overlong
  ExpectStr(EscapeName("\x7f"), "\\x7f");
}

// -o OPT is refused, and the one-line message contains WANT.
static void ExpectOptionRefused(const char* opt, const char* want) {
  ckpt::Config c;
  std::string o = opt;
  auto r = ckpt::TakeOwnOptions(&o, &c);
  cr_assert(!r.has_value(), "-o %s accepted", opt);
  cr_assert(r.error().find(want) != std::string::npos, "%s", r.error().c_str());
  cr_assert(r.error().find('\n') == std::string::npos);
}

// An on|off switch NAME (-o NAME=on, NAME=off, bare NAME): its default,
// both values taken out of the list with the rest left to libfuse, and
// anything else refused in one line.
static void ExpectSwitch(const char* name, bool ckpt::Config::*field, bool dflt) {
  const std::string n(name);
  cr_assert_eq(ckpt::Config{}.*field, dflt, "default of %s", name);
  ckpt::Config c;
  std::string o = "allow_other," + n + "=off,max_read=131072";
  cr_assert(ckpt::TakeOwnOptions(&o, &c).has_value());
  cr_assert(!(c.*field), "%s=off", name);
  cr_assert_str_eq(o.c_str(), "allow_other,max_read=131072", "libfuse keeps the rest");
  for (const std::string& on : {n + "=on", n}) {
    o = on;
    cr_assert(ckpt::TakeOwnOptions(&o, &c).has_value());
    cr_assert(c.*field, "%s", on.c_str());
    cr_assert_str_eq(o.c_str(), "");
  }
  ExpectOptionRefused((n + "=maybe").c_str(), (n + "=on or " + n + "=off").c_str());
}

Test(config, take_own_options) {
  ckpt::Config c;
  std::string o = "";
  cr_assert(ckpt::TakeOwnOptions(&o, &c).has_value());
  cr_assert_str_eq(o.c_str(), "");
  ExpectSwitch("passthrough", &ckpt::Config::passthrough, true);
  ExpectSwitch("tier_huge", &ckpt::Config::tier_huge, false);  // 4 KiB pages by default
  ExpectSwitch("io_uring", &ckpt::Config::io_uring, true);     // where the kernel has it
  ExpectSwitch("reply_yield", &ckpt::Config::reply_yield, true);
}

// --persist-every, --persist-interval, --keep-in-memory and their -o forms:
// a count of at least 1, nothing else.
Test(config, checkpoint_policy_counts) {
  cr_assert_eq(*ckpt::ParseCount("1"), 1u);
  cr_assert_eq(*ckpt::ParseCount("3"), 3u);
  cr_assert_eq(*ckpt::ParseCount("1000000000"), 1000000000u);
  for (const char* bad : {"0", "-1", "+3", "1.5", "", " 3", "3 ", "3s", "1000000001", "99999999999", "0x10", "ten"}) {
    auto r = ckpt::ParseCount(bad);
    cr_assert(!r.has_value(), "'%s' accepted", bad);
    cr_assert(r.error().find("want a whole number from 1") != std::string::npos, "%s", r.error().c_str());
  }
  ckpt::Config c;
  std::string o = "allow_other,persist_every=3,keep_in_memory=2,persist_interval=600";
  cr_assert(ckpt::TakeOwnOptions(&o, &c).has_value());
  cr_assert_str_eq(o.c_str(), "allow_other");
  cr_assert_eq(c.persist_every, 3u);
  cr_assert_eq(c.keep_in_memory, 2u);
  cr_assert_eq(c.persist_interval_s, 600u);
  ExpectOptionRefused("persist_every=0", "-o persist_every=0");
}

// --replicas and --peer-fanout: 0 (off) too, nothing else new.
Test(config, counts_that_may_be_zero) {
  cr_assert_eq(*ckpt::ParseCountOrZero("0"), 0u);
  cr_assert_eq(*ckpt::ParseCountOrZero("4"), 4u);
  for (const char* bad : {"00", "-0", "-1", "", "4x", "1000000001", "0x1"}) {
    auto r = ckpt::ParseCountOrZero(bad);
    cr_assert(!r.has_value(), "'%s' accepted", bad);
    cr_assert(r.error().find("want 0 or a whole number") != std::string::npos, "%s", r.error().c_str());
  }
}

// --shared-ttl and -o shared_ttl=: whole seconds, 0 (off) to a day.
Test(config, shared_ttl) {
  cr_assert_eq(ckpt::Config{}.shared_ttl_s, 1u);
  cr_assert_eq(*ckpt::ParseTtl("0"), 0u);
  cr_assert_eq(*ckpt::ParseTtl("1"), 1u);
  cr_assert_eq(*ckpt::ParseTtl("86400"), 86400u);
  for (const char* bad : {"-1", "+3", "1.5", "", " 3", "3 ", "3s", "86401", "99999999999", "0x10", "ten"}) {
    auto r = ckpt::ParseTtl(bad);
    cr_assert(!r.has_value(), "'%s' accepted", bad);
    cr_assert(r.error().find("want whole seconds from 0") != std::string::npos, "%s", r.error().c_str());
    cr_assert(r.error().find('\n') == std::string::npos);
  }
  ckpt::Config c;
  std::string o = "allow_other,shared_ttl=0,persist_every=2";
  cr_assert(ckpt::TakeOwnOptions(&o, &c).has_value());
  cr_assert_str_eq(o.c_str(), "allow_other");
  cr_assert_eq(c.shared_ttl_s, 0u);
  o = "shared_ttl=5";
  cr_assert(ckpt::TakeOwnOptions(&o, &c).has_value());
  cr_assert_eq(c.shared_ttl_s, 5u);
  ExpectOptionRefused("shared_ttl=x", "-o shared_ttl=x");
}

// --drain-yield and -o drain_yield=: milliseconds, 0 (never wait) to a
// minute; 1000 by default.
Test(config, drain_yield) {
  cr_assert_eq(ckpt::Config{}.drain_yield_ms, 1000u);
  cr_assert_eq(*ckpt::ParseMillis("0"), 0u);
  cr_assert_eq(*ckpt::ParseMillis("60000"), 60000u);
  for (const char* bad : {"-1", "+3", "1.5", "", " 3", "3ms", "60001", "99999999999", "0x10"}) {
    auto r = ckpt::ParseMillis(bad);
    cr_assert(!r.has_value(), "'%s' accepted", bad);
    cr_assert(r.error().find("want milliseconds from 0 to 60000") != std::string::npos, "%s", r.error().c_str());
  }
  ckpt::Config c;
  std::string o = "allow_other,drain_yield=0";
  cr_assert(ckpt::TakeOwnOptions(&o, &c).has_value());
  cr_assert_str_eq(o.c_str(), "allow_other");
  cr_assert_eq(c.drain_yield_ms, 0u);
  o = "drain_yield=250";
  cr_assert(ckpt::TakeOwnOptions(&o, &c).has_value());
  cr_assert_eq(c.drain_yield_ms, 250u);
  ExpectOptionRefused("drain_yield=soon", "-o drain_yield=soon");
}
