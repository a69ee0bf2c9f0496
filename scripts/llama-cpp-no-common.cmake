# Read by CMake before each project() of llama.cpp's build in the llama-cpp-sys-2 crate
# (.cargo/config.toml sets CMAKE_PROJECT_INCLUDE_BEFORE, which that build script passes
# on to CMake with every other CMAKE_* variable of the environment).
#
# It keeps llama.cpp's `common` library (argument parsing, chat parsers, an HTTP client:
# half of the C++ build, 119 of 220 s on two cores) out of the build. The llamacpp
# engine calls none of it: llama-cpp-2 is asked for no `common` feature. But llama-cpp-2
# 0.1.160 depends on llama-cpp-sys-2 without `default-features = false`, so that crate's
# default `common` feature is on whatever a user of llama-cpp-2 asks, and cargo offers no
# way to turn a dependency's default feature off from above. Reproduction: a crate with
# `llama-cpp-2 = { version = "=0.1.160", default-features = false }` builds
# `out/build/common/` (docs/development.md, "CI").
set(LLAMA_BUILD_COMMON OFF CACHE BOOL "llama.cpp's common library: not used by llmgate" FORCE)
