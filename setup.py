"""Where distlab's packages go when it is installed; everything else is in pyproject.toml.

On disk the project is three folders, harness/, labs/ and distlab/ (the entry point), and the code
imports `harness.x` and `labs.common.x` absolutely. A wheel installs them under one top-level
package of the project's own name, distlab/harness and distlab/labs, so that a shared
site-packages holds no generic `harness` or `labs`; `distlab` (distlab/__init__.py) puts that
folder on its own sys.path. An editable install (pip install -e, what `make setup` does) keeps
the checkout as it lies: harness and labs importable at the top, as the tests and the ranks
started from a checkout expect.
"""

from setuptools import find_packages, setup
from setuptools.command.editable_wheel import editable_wheel

CHECKOUT = find_packages(include=["harness", "harness.*", "labs", "labs.*"])


class EditableCheckout(editable_wheel):
    """pip install -e: the packages where they lie in the checkout, not nested under distlab."""

    def finalize_options(self) -> None:
        self.distribution.packages = ["distlab", *CHECKOUT]
        self.distribution.package_dir = {}
        super().finalize_options()


setup(packages=["distlab", *(f"distlab.{name}" for name in CHECKOUT)],
      package_dir={"distlab.harness": "harness", "distlab.labs": "labs"},
      cmdclass={"editable_wheel": EditableCheckout})
