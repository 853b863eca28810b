# SPDX-License-Identifier: MIT
# rmsnormd - one Makefile for everything.  `make` builds under build/,
# `make test` runs every suite, `make demo` shows the daemon working.
#
# Knobs (every one of them lives here):
#   DEBUG=1        -O0 -g3, assertions on
#   ASAN=1 UBSAN=1 sanitizers (objects go to build/san so they never mix)
#   V=1            print full commands
#   WERROR=1       warnings are errors (CI)
#   CUDA=0         build without the CUDA Toolkit even where it exists
#   NVCC_GENCODE=  override the CUDA targets (default sm_80, sm_90 + compute_90 PTX)
#   CUDA_HOME=     where the CUDA Toolkit lives (else /usr/local/cuda, else nvcc on PATH)
#   PREFIX= DESTDIR= LIBDIR= INCLUDEDIR=  for `make install` (LIBDIR for multiarch:
#                  LIBDIR=/usr/lib/x86_64-linux-gnu)
#   WITH_MPS=1     `make install` also installs the NVIDIA MPS units (opt-in)
#   PYTHON=        the interpreter of `make install-python` and of the Python tests
#                  (default python3)
#   JOBS=          parallel jobs (default: the number of CPUs; a -j on the command
#                  line wins)
#   CPPFLAGS= CFLAGS= LDFLAGS=  added to the build's own (dpkg-buildflags' output works)

.SUFFIXES:
.DELETE_ON_ERROR:
# Keep every object: test and bench objects are intermediates of pattern
# rules, and make would otherwise delete and rebuild them on every run.
.SECONDARY:
SHELL := /bin/bash
comma := ,
space := $(subst ,, )

# Build in parallel unless told otherwise: the test, fuzz and benchmark
# programs take over a minute to build one at a time on two cores.
# A sub-make shares its parent's job slots instead.
JOBS ?= $(shell nproc 2>/dev/null || echo 1)
ifeq ($(MAKELEVEL),0)
MAKEFLAGS += -j$(JOBS)
endif

# The one version number: VERSION is read here (the C library, rmsnormctl,
# the pkg-config file) and by the Python package (python/rmsnormd/VERSION
# links to it); the public header's RN_VERSION_* must agree (checked where
# the installed header is made).
VERSION := $(shell cat VERSION)
VERSION_MAJOR := $(word 1,$(subst ., ,$(VERSION)))
PREFIX ?= /usr/local
SOVERSION := $(VERSION_MAJOR)
PYTHON ?= python3

# ---- dependencies ----------------------------------------------------------
# Debian package names; `make deps` installs the missing ones as root.
DEB_PKGS := libuv1-dev libnanomsg-dev libmsgpack-dev libsystemd-dev libcmocka-dev \
            pkg-config clang libclang-rt-14-dev python3-pytest python3-prometheus-client \
            python3-setuptools python3-wheel valgrind systemd
# What the Python tests import, for an interpreter other than Debian's
# (PYTHON=, or a python3 from pyenv or a venv first on PATH): pip installs them.
PY_TEST_MODS := pytest prometheus_client setuptools wheel
# The product needs the first four; the tests need cmocka as well.
PRODUCT_PC_MODS := libuv nanomsg msgpack libsystemd
PC_MODS := $(PRODUCT_PC_MODS) cmocka
DEPS_OK := $(shell pkg-config --exists $(PC_MODS) 2>/dev/null && echo yes)
PRODUCT_DEPS_OK := $(shell pkg-config --exists $(PRODUCT_PC_MODS) 2>/dev/null && echo yes)

# ---- build configuration ---------------------------------------------------
ifneq ($(ASAN)$(UBSAN),)
BUILD ?= build/san
else
BUILD ?= build
endif

CC ?= cc
ifeq ($(origin CC),default)
CC := gcc
endif

CSTD := -std=c11 -D_GNU_SOURCE
WARN := -Wall -Wextra -Wstrict-prototypes -Wmissing-prototypes -Wshadow -Wno-unused-parameter
ifeq ($(DEBUG),1)
OPT := -O0 -g3
else
OPT := -O2 -g -DNDEBUG
endif
SAN :=
ifeq ($(ASAN),1)
SAN += -fsanitize=address -fno-omit-frame-pointer
endif
ifeq ($(UBSAN),1)
SAN += -fsanitize=undefined -fno-sanitize-recover=undefined
endif
ifeq ($(WERROR),1)
WARN += -Werror
endif

ifeq ($(PRODUCT_DEPS_OK),yes)
PC_CFLAGS := $(shell pkg-config --cflags $(PRODUCT_PC_MODS))
LIBUV := $(shell pkg-config --libs libuv)
LIBNN := $(shell pkg-config --libs nanomsg)
LIBMP := $(shell pkg-config --libs msgpack)
LIBSD := $(shell pkg-config --libs libsystemd)
endif
ifeq ($(DEPS_OK),yes)
PC_CFLAGS += $(shell pkg-config --cflags cmocka)
LIBCMOCKA := $(shell pkg-config --libs cmocka)
endif

INCLUDES := -Iproto -Ikernels -Iclient -Iclient/ctl -Idaemon -Itests
CFLAGS_ALL := $(CSTD) $(OPT) $(WARN) $(SAN) -fPIC -pthread $(INCLUDES) $(PC_CFLAGS) \
              -DRN_VERSION='"$(VERSION)"' $(CPPFLAGS) $(CFLAGS)
LDFLAGS_ALL := $(SAN) -pthread $(LDFLAGS)

# ---- CUDA ------------------------------------------------------------------
ifneq ($(CUDA),0)
ifneq ($(CUDA_HOME),)
NVCC := $(wildcard $(CUDA_HOME)/bin/nvcc)
endif
ifeq ($(NVCC),)
NVCC := $(wildcard /usr/local/cuda/bin/nvcc)
endif
ifeq ($(NVCC),)
NVCC := $(shell command -v nvcc 2>/dev/null)
endif
endif
ifneq ($(NVCC),)
HAVE_CUDA := 1
CUDA_ROOT := $(patsubst %/bin/nvcc,%,$(NVCC))
CUDA_INC := -I$(CUDA_ROOT)/include
CUDA_LIBDIR := $(firstword $(wildcard $(CUDA_ROOT)/lib64 $(CUDA_ROOT)/lib))
# Static cudart: the binaries run on a GPU host without a matching toolkit and
# on a CPU-only host (where CUDA simply reports no device).
LIBCUDART := -L$(CUDA_LIBDIR) -lcudart_static -ldl -lrt
NVCC_GENCODE ?= -gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_90,code=sm_90 \
                -gencode=arch=compute_90,code=compute_90
NVCC_OPT := $(if $(filter 1,$(DEBUG)),-O0 -g -lineinfo,-O3 -lineinfo)
NVCCFLAGS_ALL := -std=c++17 $(NVCC_OPT) $(NVCC_GENCODE) -Xcompiler -fPIC,-Wall -Ikernels \
                 --expt-relaxed-constexpr $(NVCCFLAGS)
else
HAVE_CUDA :=
endif
# Whether CUDA could run here at all (the driver's library is installed).
HAVE_DRIVER := $(shell /sbin/ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 ' && echo 1)

ifeq ($(V),1)
Q :=
say = @true
else
Q := @
say = @printf '  %-7s %s\n' $(1) $(2)
endif

# ---- sources -----------------------------------------------------------------
# Every folder's sources are picked up by wildcard: adding a file needs no edit
# here.  Naming rules:
#   daemon/cuda/*.c                    the CUDA backend, only built with a CUDA Toolkit
#   daemon/*_cuda.c, client/*_cuda.c   likewise
#   client/ctl/*.c                     rmsnormctl; client/*.c is libclient
#   tests/<suite>/test_*.c             one test binary each (cmocka)
#   tests/<suite>/prog_*.c             helper programs the tests run
#   tests/<suite>/<other>.c            shared code linked into that suite's binaries
#   bench/*.c                          one benchmark program each, except
#                                      BENCH_SHARED: pieces some of them link
#                                      (a rule below names which)
cuda_filter = $(if $(HAVE_CUDA),$(1),$(filter-out %_cuda.c,$(1)))

PROTO_SRC := $(wildcard proto/*.c)
KCPU_SRC := $(wildcard kernels/*.c)
KCU_SRC := $(if $(HAVE_CUDA),$(wildcard kernels/*.cu))
DAEMON_SRC := $(call cuda_filter,$(wildcard daemon/*.c)) $(if $(HAVE_CUDA),$(wildcard daemon/cuda/*.c))
CTL_SRC := $(call cuda_filter,$(wildcard client/ctl/*.c))
CLIENT_SRC := $(call cuda_filter,$(wildcard client/*.c))

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(filter %.c,$(1))) \
      $(patsubst %.cu,$(BUILD)/obj/%.cu.o,$(filter %.cu,$(1)))

LIBPROTO := $(BUILD)/libproto.a
LIBKCPU := $(BUILD)/librnk_cpu.a
LIBKCUDA := $(if $(HAVE_CUDA),$(BUILD)/librnk_cuda.a)
LIBCLIENT_A := $(BUILD)/librmsnorm_client.a
LIBCLIENT_SO := $(BUILD)/librmsnorm_client.so.$(VERSION)
RMSNORMD := $(BUILD)/rmsnormd
RMSNORMCTL := $(BUILD)/rmsnormctl
PUBLIC_H := $(BUILD)/include/rmsnorm_client.h

CUDA_DEFS := $(if $(HAVE_CUDA),-DRN_HAVE_CUDA=1 $(CUDA_INC))
KLIBS := $(LIBKCUDA) $(LIBKCPU) $(if $(HAVE_CUDA),$(LIBCUDART) -lstdc++)
SYSLIBS := -lm -lrt -ldl
# libclient's CUDA part (client/*_cuda.c) reaches the driver through a static
# cudart, as NCCL does, so a worker linking the .so needs no CUDA link flags
# of its own; the static library names them in the .pc file's Libs.private.
CLIENT_CUDA := $(if $(HAVE_CUDA),$(LIBCUDART) -lstdc++)

TEST_SUITES := unit integration gpu
suite_dir = tests/$(1)
suite_own = $(filter-out tests/$(1)/test_%.c tests/$(1)/prog_%.c,$(call cuda_filter,$(wildcard tests/$(1)/*.c)))
# The GPU suite reuses the integration suite's harness (daemon start-up, readiness).
suite_shared = $(call suite_own,$(1)) $(if $(filter gpu,$(1)),$(call suite_own,integration))
suite_tests = $(patsubst tests/$(1)/%.c,$(BUILD)/tests/$(1)/%,$(call cuda_filter,$(wildcard tests/$(1)/test_*.c)))
suite_progs = $(patsubst tests/$(1)/%.c,$(BUILD)/tests/$(1)/%,$(call cuda_filter,$(wildcard tests/$(1)/prog_*.c)))

UNIT_BINS := $(call suite_tests,unit) $(call suite_progs,unit)
INTEG_BINS := $(call suite_tests,integration) $(call suite_progs,integration)
GPU_BINS := $(if $(HAVE_CUDA),$(call suite_tests,gpu) $(call suite_progs,gpu))
# The programs in bench/ measure the GPU; the CPU backend's benchmark is
# `rmsnormctl bench`.
BENCH_SHARED := bench/kernel_trace.c bench/kernel_accuracy.c bench/kernel_floor.c \
                bench/kernel_report.c bench/e2e_client.c bench/seqwords_daemon.c bench/bench_host.c
BENCH_BINS := $(if $(HAVE_CUDA),$(patsubst bench/%.c,$(BUILD)/bench/%,$(filter-out $(BENCH_SHARED),$(wildcard bench/*.c))))
FUZZ_SRC := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_REPLAY := $(patsubst tests/fuzz/%.c,$(BUILD)/tests/fuzz/replay_%,$(FUZZ_SRC))

# What is installed: the programs, the library, its header and .pc file.
PRODUCT := $(RMSNORMD) $(RMSNORMCTL) $(LIBCLIENT_A) $(LIBCLIENT_SO) $(PUBLIC_H) \
           $(BUILD)/rmsnorm-client.pc
# examples/*.c: programs a worker could start from, built against the
# product as an installed copy would be (the header and the shared library).
EXAMPLE_BINS := $(patsubst examples/%.c,$(BUILD)/examples/%,$(wildcard examples/*.c))
ALL_BINS := $(PRODUCT) $(EXAMPLE_BINS) $(UNIT_BINS) $(INTEG_BINS) $(GPU_BINS) \
            $(BENCH_BINS) $(FUZZ_REPLAY)

# ---- top-level targets -----------------------------------------------------
.PHONY: all product deps test test-unit test-integration test-gpu demo run fuzz clean \
        install install-python uninstall cuda-note build-note format

ifneq ($(DEPS_OK),yes)
# Something is missing: install it, then re-run the same goal with a fresh
# pkg-config view of the system.  `make install` is not among these goals:
# installing builds and installs the product and never fetches packages.
all product test test-unit test-integration test-gpu demo run fuzz:
	@$(MAKE) --no-print-directory deps
	@$(MAKE) --no-print-directory $@
else
all: cuda-note build-note $(ALL_BINS)

# Only what `make install` installs: no test or benchmark program.
product: cuda-note $(PRODUCT)

test: all
	@tests/run.sh $(BUILD)

test-unit: all
	@tests/run.sh $(BUILD) unit fuzz

test-integration: all
	@tests/run.sh $(BUILD) integration python

test-gpu: all
	@tests/run.sh $(BUILD) gpu

# The demo and the daemon need the two programs only, not the tests.  On a
# host without an NVIDIA driver the demo and `make run` can only use the CPU
# backend: they are built without the CUDA kernels (nvcc takes most of a
# clean build), in $(BUILD)/cpu so that its objects never mix with a full
# build's.
ifeq ($(HAVE_CUDA)$(HAVE_DRIVER),1)
demo:
	@echo "note: no NVIDIA driver (libcuda.so.1 not found): the demo runs the CPU backend, built without CUDA in $(BUILD)/cpu"
	@$(MAKE) --no-print-directory CUDA=0 BUILD=$(BUILD)/cpu demo

run:
	@echo "note: no NVIDIA driver (libcuda.so.1 not found): the daemon runs the CPU backend, built without CUDA in $(BUILD)/cpu"
	@$(MAKE) --no-print-directory CUDA=0 BUILD=$(BUILD)/cpu run
else
demo: cuda-note $(RMSNORMD) $(RMSNORMCTL)
	@tests/demo.sh $(BUILD)

run: cuda-note $(RMSNORMD) $(RMSNORMCTL)
	$(RMSNORMD) --backend auto
endif
endif

build-note:
	@echo "note: building the product and $(words $(EXAMPLE_BINS) $(UNIT_BINS) $(INTEG_BINS) $(GPU_BINS) $(BENCH_BINS) $(FUZZ_REPLAY)) example, test, fuzz and benchmark programs with -j$(JOBS) (make product: the product alone)"

cuda-note:
ifeq ($(CUDA),0)
	@echo "note: CUDA=0: building the CPU-only parts"
else ifeq ($(HAVE_CUDA),)
	@echo "note: no CUDA Toolkit found (CUDA_HOME, /usr/local/cuda, nvcc on PATH): building the CPU-only parts"
else
	@[ -e $(LIBKCUDA) ] || echo "note: compiling the CUDA kernels with nvcc takes most of a clean build (CUDA=0 leaves them out)"
endif

deps:
	@missing=""; for p in $(DEB_PKGS); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -z "$$missing" ]; then echo "deps: all present"; exit 0; fi; \
	if [ "$$(id -u)" != 0 ]; then \
	  echo "deps: missing:$$missing"; \
	  echo "deps: run as root:  apt-get update && apt-get install -y$$missing"; exit 1; \
	fi; \
	echo "deps: installing$$missing"; \
	export DEBIAN_FRONTEND=noninteractive; \
	apt-get update -qq && apt-get install -y -qq --no-install-recommends $$missing >/dev/null && \
	echo "deps: installed$$missing"
	@if ! $(PYTHON) -c 'import $(subst $(space),$(comma),$(PY_TEST_MODS))' 2>/dev/null && \
	    [ "$$($(PYTHON) -c 'import sys; print(sys.prefix)' 2>/dev/null)" != /usr ]; then \
	  if [ "$$(id -u)" != 0 ]; then \
	    echo "deps: $(PYTHON) lacks some of $(PY_TEST_MODS): $(PYTHON) -m pip install $(PY_TEST_MODS)"; \
	  else \
	    echo "deps: pip installing $(PY_TEST_MODS) for $(PYTHON)"; \
	    $(PYTHON) -m pip install --quiet --disable-pip-version-check --root-user-action=ignore $(PY_TEST_MODS); \
	  fi; \
	fi

clean:
	rm -rf build

format:
	clang-format -i $(wildcard proto/*.[ch] kernels/*.[ch] kernels/*.cu daemon/*.[ch] daemon/cuda/*.[ch] client/*.[ch] client/ctl/*.[ch] tests/*/*.[ch] bench/*.c)

# ---- compile rules -------------------------------------------------------------
# The dependency files name each object both as BUILD gives it and as an
# absolute path: a build directory made with BUILD=$$PWD/build and then
# with the default (or the other way round) still rebuilds what includes a
# header that changed.  (nvcc takes one target name: a .cu object follows
# its headers only under the BUILD it was built with.)
$(BUILD)/obj/%.o: %.c
	$(call say,CC,$<)
	@mkdir -p $(@D)
	$(Q)$(CC) $(CFLAGS_ALL) $(CUDA_DEFS) -MMD -MP -MT $@ -MT $(abspath $@) -c $< -o $@

$(BUILD)/obj/%.cu.o: %.cu
	$(call say,NVCC,$<)
	@mkdir -p $(@D)
	$(Q)$(NVCC) $(NVCCFLAGS_ALL) -MMD -MP -c $< -o $@

$(LIBPROTO): $(call obj,$(PROTO_SRC))
$(LIBKCPU): $(call obj,$(KCPU_SRC))
$(BUILD)/librnk_cuda.a: $(call obj,$(KCU_SRC))
$(LIBCLIENT_A): $(call obj,$(CLIENT_SRC) $(PROTO_SRC))
$(BUILD)/%.a:
	$(call say,AR,$@)
	@mkdir -p $(@D)
	$(Q)rm -f $@ && ar rcs $@ $^

# The CPU twin's dw must equal the GPU's bit for bit: no fused multiply-add
# may merge its products and sums, whatever -std or -march a build adds.
$(BUILD)/obj/kernels/%.o: CFLAGS_ALL += -ffp-contract=off

# libclient: hidden visibility, only RN_EXPORT symbols leave the .so.
$(BUILD)/obj/client/%.o: CFLAGS_ALL += -fvisibility=hidden -DRN_BUILDING_CLIENT
# proto's objects go into the .so too; only the RN_EXPORT API may leave it.
$(BUILD)/obj/proto/%.o: CFLAGS_ALL += -fvisibility=hidden
$(LIBCLIENT_SO): $(call obj,$(CLIENT_SRC) $(PROTO_SRC))
	$(call say,LD,$@)
	$(Q)$(CC) -shared -Wl,-soname,librmsnorm_client.so.$(SOVERSION) -Wl,--no-undefined \
	    -o $@ $^ $(LDFLAGS_ALL) $(LIBNN) $(LIBMP) $(CLIENT_CUDA) $(SYSLIBS)
	$(Q)ln -sf librmsnorm_client.so.$(VERSION) $(BUILD)/librmsnorm_client.so.$(SOVERSION)
	$(Q)ln -sf librmsnorm_client.so.$(SOVERSION) $(BUILD)/librmsnorm_client.so

# The installed header is rmsnorm_client.h with rn_wire.h folded in, so a
# worker includes exactly one file.
$(PUBLIC_H): client/rmsnorm_client.h proto/rn_wire.h VERSION
	@mkdir -p $(@D)
	$(Q)hv=$$(sed -n 's/^#define RN_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\)$$/\2/p' $< | paste -sd.); \
	if [ "$$hv" != "$(VERSION)" ]; then \
	    echo "$<: RN_VERSION_* say $$hv, the VERSION file says $(VERSION)" >&2; exit 1; fi
	$(Q)awk '/^#include "rn_wire.h"/ { while ((getline l < "proto/rn_wire.h") > 0) print l; next } { print }' \
	    client/rmsnorm_client.h > $@

$(BUILD)/rmsnorm-client.pc: client/rmsnorm-client.pc.in VERSION
	@mkdir -p $(@D)
	$(Q)$(PC_SED) $< > $@

$(BUILD)/examples/%: examples/%.c $(LIBCLIENT_SO) $(PUBLIC_H)
	$(call say,CC,$<)
	@mkdir -p $(@D)
	$(Q)$(CC) $(CSTD) $(OPT) $(WARN) $(SAN) -I$(BUILD)/include $(CPPFLAGS) $(CFLAGS) -o $@ $< \
	    $(LDFLAGS_ALL) -L$(BUILD) -lrmsnorm_client -lm -Wl,-rpath,'$$ORIGIN/..'

$(RMSNORMD): $(call obj,$(DAEMON_SRC)) $(LIBPROTO) $(LIBKCPU) $(LIBKCUDA)
	$(call say,LD,$@)
	$(Q)$(CC) -o $@ $(call obj,$(DAEMON_SRC)) $(LIBPROTO) $(KLIBS) $(LDFLAGS_ALL) \
	    $(LIBUV) $(LIBNN) $(LIBMP) $(LIBSD) $(SYSLIBS)

$(RMSNORMCTL): $(call obj,$(CTL_SRC)) $(LIBCLIENT_A) $(LIBKCPU)
	$(call say,LD,$@)
	$(Q)$(CC) -o $@ $(call obj,$(CTL_SRC)) $(LIBCLIENT_A) $(LIBKCPU) $(LDFLAGS_ALL) \
	    $(LIBNN) $(LIBMP) $(CLIENT_CUDA) $(SYSLIBS)

# Test and bench programs link everything a test may need; the linker keeps
# only what is used.
TEST_LIBS = $(LIBCLIENT_A) $(LIBPROTO) $(KLIBS) $(LDFLAGS_ALL) $(LIBCMOCKA) $(LIBUV) \
            $(LIBNN) $(LIBMP) $(LIBSD) $(SYSLIBS)
define suite_rules
$(BUILD)/tests/$(1)/%: $(BUILD)/obj/tests/$(1)/%.o $(call obj,$(call suite_shared,$(1))) \
                       $(LIBCLIENT_A) $(LIBPROTO) $(LIBKCPU) $(LIBKCUDA)
	$$(call say,LD,$$@)
	@mkdir -p $$(@D)
	$(Q)$(CC) -o $$@ $$< $(call obj,$(call suite_shared,$(1))) $$(TEST_LIBS)
endef
$(foreach s,$(TEST_SUITES),$(eval $(call suite_rules,$(s))))

# test_fastpath_dev stops the daemon for one request, caught by wrapping
# libclient's rnc_transact (the static library's, in this link alone).
$(BUILD)/tests/integration/test_fastpath_dev: TEST_LIBS += -Wl,--wrap=rnc_transact
# test_client_loss makes the watcher's duplicate of the channel fail.
$(BUILD)/tests/integration/test_client_loss: TEST_LIBS += -Wl,--wrap=fcntl

# A program's own object, then the shared bench objects it uses.
$(BUILD)/bench/bench_kernel: $(addprefix $(BUILD)/obj/bench/,kernel_trace.o kernel_accuracy.o kernel_floor.o \
                                                       kernel_report.o)
$(BUILD)/bench/bench_e2e_cuda: $(BUILD)/obj/bench/e2e_client.o
$(BUILD)/bench/bench_seqwords: $(BUILD)/obj/bench/seqwords_daemon.o
$(BUILD)/bench/bench_bell: $(BUILD)/obj/bench/bench_host.o
$(BUILD)/bench/bench_late: $(BUILD)/obj/bench/bench_host.o \
                           $(addprefix $(BUILD)/obj/tests/integration/,rawring.o rawchan.o raw.o)
$(BUILD)/bench/%: $(BUILD)/obj/bench/%.o $(LIBCLIENT_A) $(LIBPROTO) $(LIBKCPU) $(LIBKCUDA)
	$(call say,LD,$@)
	@mkdir -p $(@D)
	$(Q)$(CC) -o $@ $< $(filter $(BUILD)/obj/bench/%.o $(BUILD)/obj/tests/%.o,$(filter-out $<,$^)) \
	    $(TEST_LIBS)

# Fuzz harnesses: a replay build (normal compiler, a main that feeds files to
# the harness) that `make test` runs over the corpus and the regressions, and
# the libFuzzer build that `make fuzz` runs.
$(BUILD)/tests/fuzz/replay_%: $(BUILD)/obj/tests/fuzz/%.o $(BUILD)/obj/tests/fuzz/replay_main.o $(LIBPROTO)
	$(call say,LD,$@)
	@mkdir -p $(@D)
	$(Q)$(CC) -o $@ $^ $(LDFLAGS_ALL) $(LIBMP) $(SYSLIBS)

FUZZ_CFLAGS := $(CSTD) -O1 -g -fsanitize=fuzzer,address,undefined $(INCLUDES) $(PC_CFLAGS)
FUZZ_TIME ?= 600
build/fuzz/%: tests/fuzz/%.c $(PROTO_SRC)
	@mkdir -p $(@D)
	$(Q)clang $(FUZZ_CFLAGS) -o $@ $< $(PROTO_SRC) $(LIBMP) -lm

ifeq ($(DEPS_OK),yes)
fuzz: $(patsubst tests/fuzz/%.c,build/fuzz/%,$(FUZZ_SRC))
	@for f in $^; do \
	  name=$$(basename $$f); mkdir -p build/fuzz/corpus-$$name; \
	  echo "fuzz: $$name for $(FUZZ_TIME) s (new inputs in build/fuzz/corpus-$$name)"; \
	  $$f -max_total_time=$(FUZZ_TIME) -print_final_stats=1 -max_len=4096 \
	      -artifact_prefix=build/fuzz/ build/fuzz/corpus-$$name tests/fuzz/corpus || exit 1; \
	done
endif

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)

# ---- install / uninstall ---------------------------------------------------
BINDIR ?= $(PREFIX)/bin
SBINDIR ?= $(PREFIX)/sbin
LIBDIR ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
MANDIR ?= $(PREFIX)/share/man
DOCDIR ?= $(PREFIX)/share/doc/rmsnormd
BASHCOMPDIR ?= $(PREFIX)/share/bash-completion/completions
SYSTEMD_SYSTEMDIR ?= $(PREFIX)/lib/systemd/system
SYSTEMD_USERDIR ?= $(PREFIX)/lib/systemd/user
SYSUSERSDIR ?= $(PREFIX)/lib/sysusers.d
TMPFILESDIR ?= $(PREFIX)/lib/tmpfiles.d

# The pkg-config file: paths under PREFIX are written relative to ${prefix}
# so that `pkg-config --define-prefix` can move them.  The static cudart
# that `--static` links lives in ${cudalibdir}: the build host's toolkit by
# default; a packager sets another with --define-variable=cudalibdir=DIR.
pc_rel = $(patsubst $(PREFIX)/%,$${prefix}/%,$(1))
PC_CUDA_LIBS := $(if $(HAVE_CUDA),-L$${cudalibdir} -lcudart_static -ldl -lrt -lstdc++)
PC_SED = sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(VERSION)|g' \
             -e 's|@LIBDIR@|$(call pc_rel,$(LIBDIR))|g' -e 's|@INCLUDEDIR@|$(call pc_rel,$(INCLUDEDIR))|g' \
             -e 's|@CUDA_LIBDIR@|$(CUDA_LIBDIR)|g' -e 's|@CUDA_LIBS@|$(PC_CUDA_LIBS)|g'

# The MPS control daemon's units are an opt-in (WITH_MPS=1): the system one
# runs as root, and a node that does not use MPS should not carry it.
SYSTEM_UNITS := systemd/rmsnormd@.service $(if $(filter 1,$(WITH_MPS)),systemd/nvidia-cuda-mps.service)
USER_UNITS := systemd/user/rmsnormd@.service $(if $(filter 1,$(WITH_MPS)),systemd/user/nvidia-cuda-mps.service)
MPS_UNITS := nvidia-cuda-mps.service
MAN_PAGES := systemd/man/rmsnormd.8 systemd/man/rmsnormctl.1 systemd/man/rmsnorm_client.3
# `man rn_connect` opens rmsnorm_client(3): one .so link per public function.
lparen := (
MAN_LINKS := $(shell sed -n 's/^RN_EXPORT [^$(lparen)]*[ *]\(rn_[a-z_]*\)$(lparen).*/\1/p' client/rmsnorm_client.h)
DOC_FILES := systemd/rmsnormd.conf.example systemd/README.md \
             systemd/kubernetes/rmsnormd-daemonset.yaml LICENSE CHANGELOG.md
BASH_COMPLETION := client/ctl/rmsnormctl.bash

# `make install PREFIX=/usr/local DESTDIR=`: the daemon goes to sbin (systemd
# starts it, users do not), rmsnormctl to bin with its bash completion,
# libclient (shared with its SONAME links, and static) to LIBDIR, the one
# public header, the pkg-config file, the man pages (and a link per
# function), the systemd units (system and user; the MPS ones with
# WITH_MPS=1), the sysusers.d and tmpfiles.d entries, the example
# configuration, LICENSE and CHANGELOG (documentation files: installing never
# writes /etc).  It builds the product only and never fetches a package.
# The units name the daemon by its installed path: /usr/local/sbin/rmsnormd
# in the sources becomes $(SBINDIR)/rmsnormd.  The pkg-config file is made
# afresh here, so it names the PREFIX of this install even when the build
# used another.  The directories systemd searches include
# /usr/local/lib/systemd/{system,user}, /usr/local/lib/sysusers.d and
# /usr/local/lib/tmpfiles.d, so the default PREFIX works as it is.  Into the
# live system (no DESTDIR) as root, ldconfig refreshes the loader's cache so
# that programs and the Python package find the new library.
ifeq ($(PRODUCT_DEPS_OK),yes)
install: $(RMSNORMD) $(RMSNORMCTL) $(LIBCLIENT_A) $(LIBCLIENT_SO) $(PUBLIC_H)
	$(call say,INSTALL,$(DESTDIR)$(PREFIX))
	$(Q)set -e; D='$(DESTDIR)'; \
	install -d -m 0755 "$$D$(SBINDIR)" "$$D$(BINDIR)" "$$D$(LIBDIR)/pkgconfig" \
	    "$$D$(INCLUDEDIR)" "$$D$(MANDIR)/man1" "$$D$(MANDIR)/man3" "$$D$(MANDIR)/man8" \
	    "$$D$(DOCDIR)" "$$D$(SYSTEMD_SYSTEMDIR)" "$$D$(SYSTEMD_USERDIR)" \
	    "$$D$(SYSUSERSDIR)" "$$D$(TMPFILESDIR)" "$$D$(BASHCOMPDIR)"; \
	install -m 0755 $(RMSNORMD) "$$D$(SBINDIR)/rmsnormd"; \
	install -m 0755 $(RMSNORMCTL) "$$D$(BINDIR)/rmsnormctl"; \
	install -m 0644 $(LIBCLIENT_SO) "$$D$(LIBDIR)/librmsnorm_client.so.$(VERSION)"; \
	ln -sfn librmsnorm_client.so.$(VERSION) "$$D$(LIBDIR)/librmsnorm_client.so.$(SOVERSION)"; \
	ln -sfn librmsnorm_client.so.$(SOVERSION) "$$D$(LIBDIR)/librmsnorm_client.so"; \
	install -m 0644 $(LIBCLIENT_A) "$$D$(LIBDIR)/librmsnorm_client.a"; \
	install -m 0644 $(PUBLIC_H) "$$D$(INCLUDEDIR)/rmsnorm_client.h"; \
	$(PC_SED) client/rmsnorm-client.pc.in > "$$D$(LIBDIR)/pkgconfig/rmsnorm-client.pc"; \
	chmod 0644 "$$D$(LIBDIR)/pkgconfig/rmsnorm-client.pc"; \
	for m in $(MAN_PAGES); do \
	    install -m 0644 "$$m" "$$D$(MANDIR)/man$${m##*.}/$$(basename "$$m")"; done; \
	for f in $(MAN_LINKS); do \
	    echo ".so man3/rmsnorm_client.3" > "$$D$(MANDIR)/man3/$$f.3"; \
	    chmod 0644 "$$D$(MANDIR)/man3/$$f.3"; done; \
	install -m 0644 $(BASH_COMPLETION) "$$D$(BASHCOMPDIR)/rmsnormctl"; \
	for u in $(SYSTEM_UNITS); do \
	    sed 's|/usr/local/sbin/rmsnormd|$(SBINDIR)/rmsnormd|g' "$$u" \
	        > "$$D$(SYSTEMD_SYSTEMDIR)/$$(basename "$$u")"; \
	    chmod 0644 "$$D$(SYSTEMD_SYSTEMDIR)/$$(basename "$$u")"; done; \
	for u in $(USER_UNITS); do \
	    sed 's|/usr/local/sbin/rmsnormd|$(SBINDIR)/rmsnormd|g' "$$u" \
	        > "$$D$(SYSTEMD_USERDIR)/$$(basename "$$u")"; \
	    chmod 0644 "$$D$(SYSTEMD_USERDIR)/$$(basename "$$u")"; done; \
	install -m 0644 systemd/sysusers.d/rmsnormd.conf "$$D$(SYSUSERSDIR)/rmsnormd.conf"; \
	install -m 0644 systemd/tmpfiles.d/rmsnormd.conf "$$D$(TMPFILESDIR)/rmsnormd.conf"; \
	install -m 0644 $(DOC_FILES) "$$D$(DOCDIR)/"
	@if [ -z '$(DESTDIR)' ] && [ "$$(id -u)" = 0 ] && command -v ldconfig >/dev/null; then \
	    ldconfig; fi
	@if [ -z '$(DESTDIR)' ]; then \
	    echo "installed under $(PREFIX); next, as root: systemd-sysusers;"; \
	    echo "  systemd-tmpfiles --create; systemctl daemon-reload; systemctl enable --now rmsnormd@0"; \
	    echo "  (the Python package: make install-python, or pip install ./python)"; \
	fi
	$(if $(filter 1,$(WITH_PYTHON)),@$(MAKE) --no-print-directory install-python)
else
install:
	@echo "install: the build needs pkg-config modules that are missing ($(PRODUCT_PC_MODS));" >&2
	@echo "  install them first (make deps, as root); installing never fetches packages" >&2
	@exit 1
endif

# The Python package (pure Python) with $(PYTHON)'s pip, offline where the
# interpreter has setuptools and wheel.  Into DESTDIR (a package build) it
# goes under PREFIX; else into the interpreter's own environment.  Debian's
# python3 refuses that (PEP 668) unless told: its pip then writes
# /usr/local/lib/python3.X/dist-packages, beside the rest of `make install`
# and outside the package manager's files.
install-python:
	$(call say,PIP,'$(PYTHON) ./python')
	$(Q)set -e; \
	managed=$$($(PYTHON) -c 'import os, sysconfig; print(int(os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED"))))'); \
	offline=; if $(PYTHON) -c 'import setuptools, wheel' 2>/dev/null; then \
	    offline="--no-build-isolation --no-index"; fi; \
	where=; if [ -n '$(DESTDIR)' ]; then where="--root $(DESTDIR) --prefix $(PREFIX)"; \
	elif [ "$$managed" = 1 ]; then where="--break-system-packages"; fi; \
	$(PYTHON) -m pip install --quiet --no-deps --no-warn-script-location --root-user-action=ignore --disable-pip-version-check $$offline $$where ./python; \
	rm -rf python/build python/rmsnormd.egg-info

uninstall:
	$(call say,RM,$(DESTDIR)$(PREFIX))
	$(Q)D='$(DESTDIR)'; rm -f "$$D$(SBINDIR)/rmsnormd" "$$D$(BINDIR)/rmsnormctl" \
	    "$$D$(LIBDIR)/librmsnorm_client.so.$(VERSION)" \
	    "$$D$(LIBDIR)/librmsnorm_client.so.$(SOVERSION)" "$$D$(LIBDIR)/librmsnorm_client.so" \
	    "$$D$(LIBDIR)/librmsnorm_client.a" "$$D$(LIBDIR)/pkgconfig/rmsnorm-client.pc" \
	    "$$D$(INCLUDEDIR)/rmsnorm_client.h" "$$D$(BASHCOMPDIR)/rmsnormctl" \
	    $(foreach m,$(MAN_PAGES),"$$D$(MANDIR)/man$(subst .,,$(suffix $(m)))/$(notdir $(m))") \
	    $(foreach f,$(MAN_LINKS),"$$D$(MANDIR)/man3/$(f).3") \
	    $(foreach u,$(SYSTEM_UNITS) $(MPS_UNITS),"$$D$(SYSTEMD_SYSTEMDIR)/$(notdir $(u))") \
	    $(foreach u,$(USER_UNITS) $(MPS_UNITS),"$$D$(SYSTEMD_USERDIR)/$(notdir $(u))") \
	    "$$D$(SYSUSERSDIR)/rmsnormd.conf" "$$D$(TMPFILESDIR)/rmsnormd.conf" \
	    $(foreach f,$(DOC_FILES),"$$D$(DOCDIR)/$(notdir $(f))"); \
	rmdir "$$D$(DOCDIR)" 2>/dev/null; true
