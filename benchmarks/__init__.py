"""Speed and memory of liger_jax's ops against XLA (and Liger/torch where importable), plus the end-to-end run.

Entry points: ``python -m benchmarks.run`` (op benchmarks), ``python -m benchmarks.e2e`` (Llama training step),
``python -m benchmarks.suite`` (everything, one output folder), ``python -m benchmarks.report`` (RESULTS.md and
plots from saved rows). Importing this package imports neither jax nor torch.
"""
