#!/bin/bash
# Wheels for Python 3.12 on x86-64 Linux of what bench/gpu.sh needs beyond a CUDA image that has
# jax, flax, optax, orbax and pytest but not ml_collections or tensorflow_datasets (and the needs
# of tensorflow_datasets that such an image lacks), into DIR (default .whl), for machines with no
# package index. Install there with
#   pip install --no-index --no-deps --target /tmp/site DIR/*.whl && export PYTHONPATH=/tmp/site
set -eu
DIR=${1:-.whl}
PIP=${PIP:-python3 -m pip}
$PIP download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$DIR" ml_collections==1.1.0 tensorflow-datasets==4.9.10 array_record dm-tree immutabledict \
  simple_parsing docstring-parser tensorflow-metadata googleapis-common-protos termcolor toml
$PIP wheel -q --no-deps -w "$DIR" promise   # published as a source archive only
ls "$DIR"
