# ckptfs — one Makefile.
#   make            build build/ckptfs (warnings on)
#   make run        install what is missing, build, mount ./mnt on defaults
#   make test       install what is missing, build (-j, one job per core), run every
#                   unit test and the mounted cases (three at a time: JOBS=N), then
#                   the ThreadSanitizer phase of make tsan (WITH_TSAN=0: without)
#                   and the AddressSanitizer phase of make asan (WITH_ASAN=0: without)
#   make tsan       ThreadSanitizer build (build-thread/), its unit tests and the
#                   mounted cases marked `# tsan:` (docs/testing.md)
#   make asan       AddressSanitizer + UBSan build (build-address/), its unit tests
#                   and the mounted cases marked `# asan:` (docs/testing.md)
#   make bench      benchmarks (tests/bench), never part of make test
#   make analyze    clang's thread-safety analysis (-Wthread-safety) over every source
#   make sizes      member functions per class and lines per file under fs/ (issue #31)
#   make crash-soak N=200 [SEED=S]   the kill -9 crash harness, N iterations
#   make install    install ckptfs and mount.ckptfs into $(PREFIX) and /sbin
#   SAN=address|thread   sanitizer builds (into build-$(SAN)/): address is ASan+UBSan
#   CUDA=1          also build/libckptfs_cuda.so and build/gpu_bench against the CUDA
#                   runtime in $(CUDA_HOME) (docs/gpu.md); nothing else needs CUDA

CXX      ?= g++
PREFIX   ?= /usr/local
SAN      ?=
BUILD    ?= build$(if $(SAN),-$(SAN))
# spdlog's cflags select its compiled library (SPDLOG_COMPILED_LIB): without
# it every file that logs compiled spdlog itself, about 6 s of CPU each.
comma    := ,
PKGS     := fuse3 liburing rocksdb spdlog libmicrohttpd mount ucx

# The sanitizer builds compile at -O1 with line tables only (-g1): reports
# keep functions, files and lines, and the TSan build takes about 55% of the
# time -O2 -g takes (make test builds them beside the normal one).
ifneq ($(SAN),)
CXXFLAGS ?= -O1 -g1
else
CXXFLAGS ?= -O2 -g
endif
CXXFLAGS += -std=c++23 -Wall -Wextra -Wno-unused-parameter -Werror=return-type -I. \
            -DSPDLOG_ACTIVE_LEVEL=SPDLOG_LEVEL_DEBUG \
            $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
LDLIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null) -lxxhash -lcurl -lcrypto -lpugixml -lpthread
# SAN=address is AddressSanitizer and UndefinedBehaviorSanitizer together:
# one more build would cost its compile time again. Undefined behaviour
# stops the process (-fno-sanitize-recover) as an ASan report does, so a
# report fails a test even when no one reads the log (docs/testing.md).
SAN_FLAGS := $(if $(filter address,$(SAN)),-fsanitize=address$(comma)undefined -fno-sanitize-recover=undefined,-fsanitize=$(SAN))
ifneq ($(SAN),)
CXXFLAGS += $(SAN_FLAGS) -fno-omit-frame-pointer
LDFLAGS  += $(SAN_FLAGS)
endif

LIB_SRCS := $(wildcard common/*.cc fs/*.cc fs/*/*.cc cache/*.cc backend/*.cc gpu/*.cc)
LIB_OBJS := $(LIB_SRCS:%.cc=$(BUILD)/obj/%.o)
CLI_SRCS := $(wildcard cli/*.cc)
MAIN_OBJ := $(CLI_SRCS:%.cc=$(BUILD)/obj/%.o)
# Jobs for the builds that make run/test/unit/mounted start: one per core,
# fewer if memory is short (g++ on the RocksDB headers takes about 1 GB).
BUILD_JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); \
                m=$$(awk '/^MemAvailable:/ { print int($$2 / 1100000) }' /proc/meminfo 2>/dev/null); \
                [ -n "$$m" ] && [ "$$m" -lt "$$n" ] && n=$$m; [ "$$n" -ge 1 ] || n=1; echo $$n)
UNIT_MODS := $(sort $(patsubst tests/unit/%/,%,$(dir $(wildcard tests/unit/*/test_*.cc))))
UNIT_BINS := $(UNIT_MODS:%=$(BUILD)/tests/unit_%)
# Under TSan, Criterion's sandbox needs an address TSan allows for its arena
# (tests/unit/criterion_tsan.cc says why).
UNIT_EXTRA := $(if $(filter thread,$(SAN)),$(BUILD)/obj/tests/unit/criterion_tsan.o)

.PHONY: all units deps run test unit mounted tsan asan bench install clean format stop crash-soak analyze analyze-files sizes
all: $(BUILD)/ckptfs $(if $(SAN),,$(BUILD)/libckptfs_gpuhost.so) $(if $(filter 1,$(CUDA)),$(BUILD)/libckptfs_cuda.so $(BUILD)/gpu_bench)

deps:
	@scripts/install-deps.sh

$(BUILD)/obj/%.o: %.cc
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/libckpt.a: $(LIB_OBJS)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/ckptfs: $(MAIN_OBJ) $(BUILD)/libckpt.a
	$(CXX) $(LDFLAGS) $^ -o $@ $(LDLIBS)

# The GPU path (gpu/, docs/gpu.md) as a shared library for any process to
# load (the Python module ckptfs_cuda uses ctypes): libckptfs_gpuhost.so
# copies with memcpy and is built and tested everywhere; CUDA=1 builds the
# same sources against the CUDA runtime (no nvcc needed: no kernels, only
# runtime calls) into libckptfs_cuda.so, and the GPU benchmark.
CUDA_HOME ?= /usr/local/cuda
GPU_SO_SRCS := $(wildcard gpu/*.cc) common/io.cc common/config.cc common/text.cc
GPU_SO_LINK  = -shared -Wl,--version-script=gpu/exports.map -Wl,-z,defs

$(BUILD)/pic/%.o: %.cc
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -fPIC -MMD -MP -c $< -o $@

$(BUILD)/cuda/%.o: %.cc
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -fPIC -DCKPT_HAVE_CUDA -I$(CUDA_HOME)/include -MMD -MP -c $< -o $@

$(BUILD)/libckptfs_gpuhost.so: $(GPU_SO_SRCS:%.cc=$(BUILD)/pic/%.o) gpu/exports.map
	$(CXX) $(LDFLAGS) $(GPU_SO_LINK) $(filter %.o,$^) -o $@ -lpthread

$(BUILD)/libckptfs_cuda.so: $(GPU_SO_SRCS:%.cc=$(BUILD)/cuda/%.o) gpu/exports.map
	$(CXX) $(LDFLAGS) $(GPU_SO_LINK) $(filter %.o,$^) -o $@ -lpthread -L$(CUDA_HOME)/lib64 -lcudart -Wl,-rpath,$(CUDA_HOME)/lib64

$(BUILD)/gpu_bench: tests/bench/gpu_bench.cc $(BUILD)/libckptfs_cuda.so
	$(CXX) $(CXXFLAGS) -I$(CUDA_HOME)/include $< -o $@ -L$(BUILD) -lckptfs_cuda -L$(CUDA_HOME)/lib64 -lcudart \
	  -Wl,-rpath,$(abspath $(BUILD)) -Wl,-rpath,$(CUDA_HOME)/lib64 -lpthread

# make bench's cluster simulation (docs/scale.md): many --cluster members as
# threads of one process, over s3rver or a directory.
$(BUILD)/cluster_scale: tests/bench/cluster_scale.cc $(BUILD)/libckpt.a
	$(CXX) $(CXXFLAGS) $(LDFLAGS) $^ -o $@ $(LDLIBS)

# The replica link alone, writer to holder in one process (tests/bench/replicas.sh).
$(BUILD)/link_bw: tests/bench/link_bw.cc $(BUILD)/libckpt.a
	$(CXX) $(CXXFLAGS) $(LDFLAGS) $^ -o $@ $(LDLIBS)

# One Criterion binary per module folder: build/tests/unit_<module>.
define UNIT_RULE
$(BUILD)/tests/unit_$(1): $(patsubst %.cc,$(BUILD)/obj/%.o,$(wildcard tests/unit/$(1)/*.cc)) $(UNIT_EXTRA) $(BUILD)/libckpt.a
	@mkdir -p $$(dir $$@)
	$$(CXX) $$(LDFLAGS) $$^ -o $$@ $$(LDLIBS) -lcriterion
endef
$(foreach m,$(UNIT_MODS),$(eval $(call UNIT_RULE,$(m))))

units: $(UNIT_BINS)

run: deps
	@$(MAKE) --no-print-directory -j$(BUILD_JOBS) all
	@scripts/run.sh

stop:
	@$(BUILD)/ckptfs umount $(CURDIR)/mnt

# JOBS=N: mounted cases run at once (tests/run_all.sh; default 3).
# WITH_TSAN=0: without the ThreadSanitizer phase (make tsan runs it alone).
# WITH_ASAN=0: without the AddressSanitizer phase (make asan runs it alone).
WITH_TSAN ?= 1
WITH_ASAN ?= 1
# The sanitizer trees are built by tests/run_all.sh beside the parallel
# mounted cases (TSAN_BUILD_CMD, then ASAN_BUILD_CMD), not before them.
test: deps
	@$(MAKE) --no-print-directory -j$(BUILD_JOBS) all units
	@BUILD=$(BUILD) $(if $(filter-out 0,$(WITH_TSAN)),TSAN=build-thread TSAN_BUILD_CMD="$(MAKE) --no-print-directory SAN=thread BUILD=build-thread -j$(BUILD_JOBS) all units") \
	  $(if $(filter-out 0,$(WITH_ASAN)),ASAN=build-address ASAN_BUILD_CMD="$(MAKE) --no-print-directory SAN=address BUILD=build-address -j$(BUILD_JOBS) all units") \
	  $(if $(JOBS),JOBS=$(JOBS)) tests/run_all.sh

unit:
	@$(MAKE) --no-print-directory -j$(BUILD_JOBS) all units
	@BUILD=$(BUILD) ONLY=unit tests/run_all.sh

mounted:
	@$(MAKE) --no-print-directory -j$(BUILD_JOBS) all
	@BUILD=$(BUILD) $(if $(JOBS),JOBS=$(JOBS)) ONLY=mount tests/run_all.sh

# ThreadSanitizer: a SAN=thread build in build-thread/ (nothing shared with
# build/), then its unit binaries and the mounted cases marked `# tsan:`
# against its daemon; any TSan report fails (docs/testing.md).
tsan: deps
	@$(MAKE) --no-print-directory SAN=thread -j$(BUILD_JOBS) all units
	@TSAN=build-thread ONLY=tsan $(if $(JOBS),JOBS=$(JOBS)) tests/run_all.sh

# AddressSanitizer and UndefinedBehaviorSanitizer: a SAN=address build in
# build-address/, then its unit binaries and the mounted cases marked
# `# asan:` (daemons stopped or killed with requests in flight) against its
# daemon; any ASan or UBSan report fails (docs/testing.md).
asan: deps
	@$(MAKE) --no-print-directory SAN=address -j$(BUILD_JOBS) all units
	@ASAN=build-address ONLY=asan $(if $(JOBS),JOBS=$(JOBS)) tests/run_all.sh

bench: deps
	@scripts/install-bench-deps.sh
	@$(MAKE) --no-print-directory all
	@BUILD=$(BUILD) tests/bench/run.sh

# The crash harness beyond make test's bounded set (tests/mount/cases/crash_bounded.sh:
# one crash of each kind): N random seeds, every kind, random kills the most.
# The multi-node kinds run by hand: tests/crash/harness.py --nodes 3 --iterations N
# (mn-kill), and with --kind mn-lost --cluster-store etcd://HOST:PORT (a lost node).
N ?= 200
crash-soak: all
	@BUILD=$(BUILD) tests/crash/harness.py --iterations $(N) $(if $(SEED),--seed $(SEED))

# make analyze: Clang's thread-safety analysis (common/thread_annotations.h,
# common/mutex.h) over every source of the daemon and the CLI, syntax only
# (no objects); any warning fails it, the analysis's and clang's -Wall ones
# alike. Incremental: a file is checked again when it, a header it includes
# or this Makefile changes (stamps in $(BUILD)/analyze/).
#
# The compiler is Debian 12's clang-16, installed on first use (make test does
# not need it). Not the default clang 14, because of std::expected: libstdc++
# 12 declares it only when __cpp_concepts >= 202002L (it needs conditionally
# trivial destructors, P0848). Clang 16 implements P0848 but still reports
# 201907L, so the analysis, and only it, redefines the macro (-U, then -D: no
# redefinition warning). Clang 14 and 15 reject <expected> even so.
ANALYZE_CXX   ?= clang++-16
ANALYZE_PKG   ?= clang-16
ANALYZE_FLAGS := -std=c++2b -fsyntax-only -Werror -Wall -Wextra -Wno-unused-parameter \
                 -Wthread-safety -Wthread-safety-beta -U__cpp_concepts -D__cpp_concepts=202002L -I. \
                 -DSPDLOG_ACTIVE_LEVEL=SPDLOG_LEVEL_DEBUG -DSPDLOG_FMT_EXTERNAL \
                 $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
ANALYZE_OKS   := $(patsubst %.cc,$(BUILD)/analyze/%.ok,$(LIB_SRCS) $(CLI_SRCS))

analyze:
	@command -v $(ANALYZE_CXX) >/dev/null || scripts/install-deps.sh $(ANALYZE_PKG)
	@$(MAKE) -s --no-print-directory -j$(BUILD_JOBS) analyze-files
	@echo "analyze: $(words $(ANALYZE_OKS)) files, no warnings ($(ANALYZE_CXX))"
	@python3 scripts/sizes.py $(ANALYZE_CXX) $(ANALYZE_FLAGS) --check >/dev/null || \
	  { python3 scripts/sizes.py $(ANALYZE_CXX) $(ANALYZE_FLAGS) --check | tail -1; exit 1; }
	@echo "analyze: every class under fs/ within 60 member functions, headers 300 lines, .cc 900 (make sizes)"

analyze-files: $(ANALYZE_OKS)

$(BUILD)/analyze/%.ok: %.cc Makefile
	@mkdir -p $(dir $@)
	@echo "analyze $<"
	@$(ANALYZE_CXX) $(ANALYZE_FLAGS) -MMD -MP -MF $(@:.ok=.d) -MT $@ $< && touch $@

# make sizes: what issue #31 bounds, measured (scripts/sizes.py): member
# functions per class under fs/ by clang's AST, lines per header and .cc.
# SIZES_CHECK=1 fails over the bounds; `make analyze` checks them too.
sizes:
	@command -v $(ANALYZE_CXX) >/dev/null || scripts/install-deps.sh $(ANALYZE_PKG)
	@python3 scripts/sizes.py $(ANALYZE_CXX) $(ANALYZE_FLAGS) $(if $(filter 1,$(SIZES_CHECK)),--check)

install: all
	install -D -m 0755 $(BUILD)/ckptfs $(DESTDIR)$(PREFIX)/bin/ckptfs
	install -D -m 0755 mount-helpers/mount.ckptfs $(DESTDIR)/sbin/mount.ckptfs
	install -D -m 0644 mount-helpers/ckptfs@.service $(DESTDIR)/etc/systemd/system/ckptfs@.service
ifeq ($(CUDA),1)
	install -D -m 0755 $(BUILD)/libckptfs_cuda.so $(DESTDIR)$(PREFIX)/lib/libckptfs_cuda.so
	install -D -m 0644 gpu/ckptfs_cuda.h $(DESTDIR)$(PREFIX)/include/ckptfs_cuda.h
	install -D -m 0644 gpu/python/ckptfs_cuda.py $(DESTDIR)$(PREFIX)/lib/python3/dist-packages/ckptfs_cuda.py
endif

format:
	clang-format -i $(LIB_SRCS) $(CLI_SRCS) $(wildcard */*.h */*/*.h tests/unit/*/*.cc)

clean:
	rm -rf build build-address build-thread

-include $(shell find $(BUILD)/obj $(BUILD)/pic $(BUILD)/cuda $(BUILD)/analyze -name '*.d' 2>/dev/null)
