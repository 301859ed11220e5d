# tandem — one GNU Makefile.
#   make            build build/tandem and build/libtandem.a (installs missing Debian packages first)
#   make run        build, then generate text with the bundled default model
#   make test       build and run every test; closes with "N passed, N failed"
#   make test SAN=1 the same under AddressSanitizer + UndefinedBehaviorSanitizer (in build/san)
CC      ?= cc
ARCH    ?= -march=native
OPT     ?= -O2
SAN     ?= 0
BUILD   ?= build
CFLAGS_BASE = -std=c11 -Wall -Wextra -Werror=implicit-function-declaration -g $(ARCH) -Iinclude -Isrc -pthread
LDLIBS  = -lpcre2-8 -lutf8proc -lcjson -lmicrohttpd -lm -pthread

ifeq ($(SAN),1)
BUILD   = build/san
OPT     = -O1
CFLAGS_BASE += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
LDFLAGS += -fsanitize=address,undefined
endif
CFLAGS += $(CFLAGS_BASE) $(OPT)

LIB_SRC  := $(filter-out src/cli/%,$(wildcard src/*/*.c src/*/*/*.c))
CLI_SRC  := $(wildcard src/cli/*.c)
TEST_SRC := $(wildcard tests/*.c)
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
CLI_OBJ  := $(CLI_SRC:%.c=$(BUILD)/obj/%.o)
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
# helper programs that test scripts (tests/*.sh) drive; not tests themselves
TOOL_SRC := $(wildcard tests/tools/*.c)
TOOL_BIN := $(TOOL_SRC:tests/tools/%.c=$(BUILD)/testtools/%)
DEPS_OK  := build/.deps-ok

.PHONY: all deps run test clean
all: $(DEPS_OK) $(BUILD)/tandem $(BUILD)/libtandem.a

$(DEPS_OK): scripts/deps
	@bash scripts/deps
	@mkdir -p build && touch $@
deps: ; @bash scripts/deps

$(BUILD)/obj/%.o: %.c | $(DEPS_OK)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

# the AVX2 kernel path exists in every x86-64 build, whatever ARCH is (selected at run time)
ifneq ($(filter x86_64%,$(shell $(CC) -dumpmachine)),)
$(BUILD)/obj/src/nn/kernels_avx2.o $(BUILD)/obj/src/nn/quant_avx2.o: CFLAGS += -mavx2 -mfma -mf16c -mno-avx512f
endif

# rebuilt from scratch: `ar r` would keep the members of source files since removed or renamed
$(BUILD)/libtandem.a: $(LIB_OBJ)
	@mkdir -p $(dir $@)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/tandem: $(CLI_OBJ) $(BUILD)/libtandem.a
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/tests/%: tests/%.c tests/t.h $(BUILD)/libtandem.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) $< $(BUILD)/libtandem.a -o $@ $(LDLIBS)

$(BUILD)/testtools/%: tests/tools/%.c $(BUILD)/libtandem.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) $< $(BUILD)/libtandem.a -o $@ $(LDLIBS)

run: all
	$(BUILD)/tandem run -p 'def fibonacci(n):' -n 96

test: all $(TEST_BIN) $(TOOL_BIN)
	@BUILD=$(BUILD) SAN=$(SAN) bash tests/run.sh

clean:
	rm -rf build

# libFuzzer harnesses (tests/fuzz/README.md): `make fuzz` builds $(BUILD)/fuzz/fuzz_* with clang,
# ASan and UBSan. Not part of all or test; needs clang only when asked for.
FUZZ_CC    ?= clang
FUZZ_FLAGS  = -std=c11 -O1 -g -Wall -Wextra $(ARCH) -fno-omit-frame-pointer -Iinclude -Isrc -pthread
FUZZ_BIN   := $(patsubst tests/fuzz/%.c,$(BUILD)/fuzz/%,$(wildcard tests/fuzz/fuzz_*.c))
# the library plus the CLI's option helpers, which src/server/server.c calls
FUZZ_OBJ   := $(patsubst %.c,$(BUILD)/fuzz/obj/%.o,$(LIB_SRC) src/cli/opts.c)
FUZZ_AVX2  := $(BUILD)/fuzz/obj/src/nn/kernels_avx2.o $(BUILD)/fuzz/obj/src/nn/quant_avx2.o
.PHONY: fuzz
fuzz: $(FUZZ_BIN)
$(BUILD)/fuzz/obj/%.o: %.c | $(DEPS_OK)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) -fsanitize=fuzzer-no-link,address,undefined -MMD -MP -c $< -o $@
# clang 14 refuses __builtin_cpu_supports("f16c"): the AVX2 kernels are built by $(CC), uninstrumented
$(FUZZ_AVX2): $(BUILD)/fuzz/obj/%.o: %.c | $(DEPS_OK)
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O2 -g -Iinclude -Isrc -pthread -mavx2 -mfma -mf16c -mno-avx512f -MMD -MP -c $< -o $@
$(BUILD)/fuzz/libtandem-fuzz.a: $(FUZZ_OBJ)
	@rm -f $@
	ar rcs $@ $^
$(BUILD)/fuzz/fuzz_%: tests/fuzz/fuzz_%.c $(BUILD)/fuzz/libtandem-fuzz.a
	$(FUZZ_CC) $(FUZZ_FLAGS) -fsanitize=fuzzer,address,undefined $< $(BUILD)/fuzz/libtandem-fuzz.a -o $@ $(LDLIBS)

-include $(LIB_OBJ:.o=.d) $(CLI_OBJ:.o=.d) $(FUZZ_OBJ:.o=.d)
