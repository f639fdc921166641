"""The estimator's tests on every supported torch version, one nox session each.

    nox -s torch-2.14.1               # one version
    nox                               # every version
    nox -s torch-2.15.0 -- -k lstm    # arguments after -- go to pytest

Each session installs that torch (the CPU build where the index has one, else the default
build, which may be a CUDA build: the estimator emulates the GPU either way), vramscope with
its test extras, and torchvision where a release for that torch exists, then runs the
estimator's tests. CI runs the README's version (torch 2.13, CPU build) through the README's
own command, not through nox.
"""

from __future__ import annotations

import nox

# the oldest supported (the GPU tests' torch), the README's, 2.14.1 and the newest release;
# the torchvision release installed with each (None: none loads with that build, or none yet)
TORCH_VERSIONS = {"2.11.0": None, "2.13.0": None, "2.14.1": "0.29.1", "2.15.0": None}
ESTIMATOR_TESTS = [
    "tests/test_estimate.py",
    "tests/test_estimate_cli.py",
    "tests/test_estimate_fast_paths.py",
    "tests/test_estimate_h200_traces.py",
    "tests/test_estimate_init.py",
    "tests/test_estimate_layers.py",
    "tests/test_allocator_sim.py",
    "tests/test_fit.py",
    "tests/test_fit_edges.py",
    "tests/test_torch_versions.py",
]

nox.options.default_venv_backend = "venv"


def _estimator_tests(torch: str, vision: str | None):
    def session(session: nox.Session) -> None:
        session.install(f"torch=={torch}")
        if vision:
            session.install(f"torchvision=={vision}")
        session.install("-e", ".[test]")
        session.run("python", "-c", "import torch; print('torch', torch.__version__)")
        session.run("python", "-m", "pytest", "-q", *ESTIMATOR_TESTS, *session.posargs)

    session.__doc__ = f"The estimator's tests on torch {torch}."
    return session


for _torch, _vision in TORCH_VERSIONS.items():
    nox.session(name=f"torch-{_torch}")(_estimator_tests(_torch, _vision))
