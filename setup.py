# The C core is built by cffi from pyllm/_build.py; everything else is in pyproject.toml.
from setuptools import setup

setup(cffi_modules=["pyllm/_build.py:ffibuilder"])
