"""Environments for the subprocesses the suite starts: this repo importable, XLA's allocator set per purpose."""

from __future__ import annotations

import os

AUTOTUNE_OFF = "--xla_gpu_autotune_level=0"


def child_env(*, autotune: bool = True, **variables: str) -> dict[str, str]:
    """This process's environment for a child: the repo on PYTHONPATH, no preallocation, ``variables`` set.

    Args:
        autotune: False adds ``--xla_gpu_autotune_level=0`` to XLA_FLAGS: the child's compiles run nothing on
            the GPU (and allocate no trial buffers there).
        **variables: further environment variables.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH")]))
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    if not autotune:
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {AUTOTUNE_OFF}".strip()
    return env | variables
