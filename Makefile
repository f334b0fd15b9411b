# One source of truth for commands: README, .ci/run and humans call these.
.DEFAULT_GOAL := help
PY ?= python3
PIP ?= $(PY) -m pip
export PIP_DISABLE_PIP_VERSION_CHECK = 1

.PHONY: help
help:  ## list the targets
	@grep -E '^[a-z0-9-]+:.*##' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

.PHONY: install
install: wheel  ## build the release wheel and install it with the HF engine (torch, transformers)
	$(PIP) install -r requirements/hf.txt
	$(PIP) install "$$(ls dist/lookahead_spec-*.whl)[hf,plot]"
	# The same version number may already be installed (editable, or an older build).
	$(PIP) install --no-deps --force-reinstall dist/lookahead_spec-*.whl

# `make demo ENGINE=llamacpp`: the demo on llama.cpp (builds llama-cpp-python first, ~7-10 min,
# and llama-server for llama.cpp's own n-gram speculator column, ~10 min).
ENGINE ?= hf
LLAMA_SERVER = target/llama-server-src/build/bin/llama-server

.PHONY: demo
demo: install  ## install, fetch the default model, run `lookahead demo` (ENGINE=llamacpp: on llama.cpp, beside llama-server)
	if [ "$(ENGINE)" = llamacpp ]; then $(MAKE) llamacpp PY="$(PY)" && $(MAKE) llama-server PY="$(PY)"; fi
	$(PY) -m lookahead.cli demo --engine $(ENGINE) $(if $(filter llamacpp,$(ENGINE)),--llama-server $(LLAMA_SERVER))

.PHONY: dev
dev:  ## editable install with test and lint tools, SGLang 0.5.23 (no CUDA deps), the peers, llama.cpp and llama-server
	$(PIP) install -r requirements/test.txt
	$(PIP) install --no-deps -r requirements/sglang-test.txt
	$(MAKE) peers PY="$(PY)"
	$(MAKE) llamacpp PY="$(PY)"
	# The llama.cpp demo's peer column is tested against the real llama-server (~9 min to build).
	$(MAKE) llama-server PY="$(PY)"
	$(PIP) install -e ".[hf,plot,test,dev]"

.PHONY: test
test: dev  ## cargo tests, bounded fuzz run, pytest (CPU; real SGLang CPU servers; no unallowed skip under CI=true), wheel smoke test
	cargo test --manifest-path rust/Cargo.toml --release
	# SGLang's NGRAM server JIT-compiles its corpus with `ninja` by name: PY's scripts
	# folder on PATH, so a venv's python works without the venv activated (a fresh clone
	# in a new venv failed there: no JIT cache yet, no ninja on PATH).
	PATH="$$($(PY) -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):$$PATH" \
		$(PY) -m pytest tests
	$(MAKE) wheel-smoke PY="$(PY)"

.PHONY: wheel
wheel:  ## release wheel (abi3: CPython >= 3.11; manylinux tag checked by maturin) and sdist, in dist/
	$(PIP) install -r requirements/build.txt
	rm -f dist/lookahead_spec-*
	$(PY) -m maturin build --release --out dist
	$(PY) -m maturin sdist --out dist

.PHONY: wheel-smoke
wheel-smoke: wheel  ## install the wheel, then the sdist's, in a fresh venv without Rust; smoke-test each
	PY="$(PY)" bash tests/wheel/run.sh dist/lookahead_spec-*.whl --sdist dist/lookahead_spec-*.tar.gz

.PHONY: lint
lint:  ## ruff, cargo fmt, clippy
	ruff check python tests benchmarks research
	ruff format --check python tests benchmarks research
	cargo fmt --all --check
	cargo clippy --manifest-path rust/Cargo.toml --all-targets -- -D warnings
	cargo clippy --manifest-path rust/Cargo.toml --all-targets --features python -- -D warnings

.PHONY: bench
bench:  ## host-cost benchmark of the trie (add --peers after `make peers`)
	$(PY) -m benchmarks trie --json benchmarks/results/trie.json --plot benchmarks/results/trie.png

.PHONY: bench-gpu
bench-gpu:  ## time the Triton kernels on a CUDA GPU (table + benchmarks/out/gpu_kernels.json)
	$(PY) -m benchmarks.gpu_kernels

.PHONY: peers
peers:  ## install the benchmark peers (SGLang NGRAM corpus, SuffixDecoding, numba) without touching torch/transformers
	$(PIP) install nanobind==3.1.0 ninja==1.13.2 cmake==4.4.5
	# The builds call cmake and ninja by name: from PY's own scripts folder, so that a venv's
	# python works without the venv activated.
	PATH="$$($(PY) -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):$$PATH" \
		$(PIP) install --no-deps --no-build-isolation -r requirements/peers.txt

# ggml's AMX kernels (built by -march=native on a CPU that reports AMX) crash the first forward
# of two or more rows: on this project's Xeon VMs, an invalid tile config (#GP at ldtilecfg, #UD
# at tilezero, llama.cpp PR #26954). Both builds leave them out; REPACK and AVX512 stay.
NO_AMX := $(if $(filter x86_64 amd64,$(shell uname -m)),-mno-amx-tile -mno-amx-int8 -mno-amx-bf16)

.PHONY: llamacpp
llamacpp:  ## the llama.cpp engine's llama-cpp-python 0.3.36, built from source (CPU; ~6-10 min on 2 cores)
	$(PIP) install nanobind==3.1.0 ninja==1.13.2 cmake==4.4.5 scikit-build-core==0.12.2
	$(PY) -c 'import llama_cpp as l, sys; sys.exit(b"AMX_INT8 = 1" in l.llama_print_system_info())' \
		2>/dev/null && echo "llama-cpp-python is installed" || \
		PATH="$$($(PY) -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):$$PATH" \
		CMAKE_ARGS="-DLLAVA_BUILD=OFF -DCMAKE_C_FLAGS='$(NO_AMX)' -DCMAKE_CXX_FLAGS='$(NO_AMX)'" \
		$(PIP) install --no-deps --no-build-isolation --force-reinstall --no-cache-dir \
		-r requirements/llamacpp.txt

.PHONY: llama-src
llama-src:  # the build tools, and the pinned llama-cpp-python sdist's llama.cpp source from PyPI
	$(PIP) install ninja==1.13.2 cmake==4.4.5 scikit-build-core==0.12.2
	mkdir -p target/llama-server-src
	cd target/llama-server-src && ls llama_cpp_python-*.tar.gz >/dev/null 2>&1 || \
		$(PY) -m pip download --no-deps --no-build-isolation -d . \
		"$$(grep -E '^llama-cpp-python==' ../../requirements/llamacpp.txt)"
	cd target/llama-server-src && ls -d llama_cpp_python-*/ >/dev/null 2>&1 || \
		tar xzf llama_cpp_python-*.tar.gz

# cmake over that source with PY's own cmake and ninja; no network at build time: no curl, no
# prebuilt web UI. The build folder and the CPU options follow.
LLAMA_CMAKE = PATH="$$($(PY) -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):$$PATH" \
	&& cmake -S target/llama-server-src/llama_cpp_python-*/vendor/llama.cpp -G Ninja \
	-DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
	-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF

.PHONY: llama-server
llama-server: llama-src  ## llama.cpp's llama-server, llama-bench, llama-quantize from the pinned llama-cpp-python sdist (benchmark peers, not shipped; ~10 min)
	$(LLAMA_CMAKE) -B target/llama-server-src/build -DGGML_NATIVE=ON \
		-DCMAKE_C_FLAGS="$(NO_AMX)" -DCMAKE_CXX_FLAGS="$(NO_AMX)" && \
		ninja -C target/llama-server-src/build llama-server llama-bench llama-quantize

# An AVX2-only CPU's kernels on an AVX512 one: the same source built for AVX2, FMA, F16C and
# BMI2 only, libllama included, so that the engine runs on it too (llama-cpp-python loads
# libllama from the folder in LLAMA_CPP_LIB_PATH). BENCHMARKS.md section 7.2 compares its
# cost curve with an AVX2-only EPYC's before trusting it.
LLAMA_AVX2 = target/llama-avx2

.PHONY: llama-avx2
llama-avx2: llama-src  ## libllama, llama-server, llama-bench, llama-quantize for AVX2 only, in target/llama-avx2/bin (benchmarks; ~8 min)
	$(LLAMA_CMAKE) -B $(LLAMA_AVX2) -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=OFF -DGGML_AVX=ON \
		-DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF \
		-DGGML_AVX_VNNI=OFF && \
		ninja -C $(LLAMA_AVX2) llama llama-server llama-bench llama-quantize

.PHONY: bench-llamacpp
bench-llamacpp: llama-server  ## llama.cpp plain and its n-gram speculators against lookahead on llama.cpp (Spec-Bench)
	$(PY) -m benchmarks llamacpp --quants q4_1,q4_0,f16 --json benchmarks/results/llamacpp.json

.PHONY: bench-accept
bench-accept:  ## acceptance simulator over the recorded traces (B = 8, 16, 32)
	$(PY) -m benchmarks accept --json benchmarks/results/accept_specbench_smollm2.json \
		--plot benchmarks/results/accept_specbench_smollm2.png
