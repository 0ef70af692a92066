# Builds the PyTorch extension's ABI-facing part without torch: the core
# (polyfuse_ext_core.cpp, polyfuse.h only) and its check, against the
# library `cargo build` made (target/$(PROFILE)). scripts/abi-test.sh runs
# it, so CI compiles the extension's C++ where torch is not installed.
#   make -C examples/torch -f core.mk && target/torch-core/core_check examples

ROOT := $(abspath ../..)
PROFILE ?= debug
LIBDIR := $(ROOT)/target/$(PROFILE)
OUT := $(ROOT)/target/torch-core
CXX ?= g++
CXXFLAGS ?= -std=c++17 -Wall -Wextra -Werror -pedantic -g -O1
CPPFLAGS += -I$(ROOT)/include

.PHONY: all clean
all: $(OUT)/core_check

$(OUT):
	mkdir -p $(OUT)

$(OUT)/core_check: core_check.cpp polyfuse_ext_core.cpp polyfuse_ext_core.hpp $(ROOT)/include/polyfuse.h | $(OUT)
	$(CXX) $(CPPFLAGS) $(CXXFLAGS) -o $@ core_check.cpp polyfuse_ext_core.cpp \
		-L$(LIBDIR) -lpolyfuse -Wl,-rpath,$(LIBDIR)

clean:
	rm -rf $(OUT)
